package settings

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// A key added at the end of Keys, in a section listed before, is written
// with its section in every generated file: adding a key is one edit
// wherever it goes in Keys.
func TestGeneratedKeyJoinsItsSection(t *testing.T) {
	saved := Keys
	t.Cleanup(func() { Keys = saved })
	Keys = append(Keys[:len(Keys):len(Keys)], Key{Name: "pool.knob", Flag: "knob", Kind: KindInt, Min: 0, Max: 10,
		Doc: "a knob",
		get: func(Pool) string { return "3" },
		set: func(*Pool, string) error { return nil }})
	if got := strings.Join(Sections(), ","); got != "pool,admission,limits" {
		t.Fatalf("sections %s, want pool,admission,limits", got)
	}
	for name, text := range map[string]string{"ChartConfig": ChartConfig(), "SectionsYAML": SectionsYAML()} {
		if n := strings.Count(text, "pool:\n"); n != 1 {
			t.Errorf("%s: pool section %d times:\n%s", name, n, text)
		}
		pool, _, _ := strings.Cut(text, "admission:\n")
		if !strings.Contains(pool, "  knob: ") {
			t.Errorf("%s: the key is not in its section:\n%s", name, text)
		}
	}
	schema, err := SchemaSection("pool")
	if err != nil || !strings.Contains(string(schema), `"knob": {`) || !strings.Contains(string(schema), strconv.Quote("knob")+"\n") {
		t.Errorf("schema: %v\n%s", err, schema)
	}
	src, err := ConfigGo()
	if err != nil || strings.Count(src, "type PoolConfig struct") != 1 || !strings.Contains(src, "Knob int `json:\"knob\"`") {
		t.Errorf("config structs: %v\n%s", err, src)
	}
}

// An agent-wide key added to AgentKeys is written in its section of the
// file, the chart's values, schema and template, and the file's structs;
// one that is no chart value only in the file and its structs.
func TestGeneratedAgentKeyJoinsItsSection(t *testing.T) {
	saved := AgentKeys
	t.Cleanup(func() { AgentKeys = saved })
	AgentKeys = append(AgentKeys[:len(AgentKeys):len(AgentKeys)],
		Key{Name: "limits.trial", Kind: KindInt, Min: 1, Default: "3", Doc: "a trial"},
		Key{Name: "limits.fileOnly", Kind: KindBool, Default: "false", NoChart: true, Doc: "not in the chart"})
	limits := func(text string) string { _, l, _ := strings.Cut(text, "limits:\n"); return l }
	for name, text := range map[string]string{"ChartConfig": ChartConfig(), "ChartValuesYAML": ChartValuesYAML(), "SectionsYAML": SectionsYAML()} {
		if !strings.Contains(limits(text), "  trial: ") {
			t.Errorf("%s: the key is not in its section:\n%s", name, text)
		}
		if strings.Contains(text, "fileOnly") != (name == "SectionsYAML") {
			t.Errorf("%s: the file-only key is written where it should not be:\n%s", name, text)
		}
	}
	schema, err := SchemaSection("limits")
	if err != nil || !strings.Contains(string(schema), `"trial": {`) || strings.Contains(string(schema), "fileOnly") {
		t.Errorf("schema: %v\n%s", err, schema)
	}
	src, err := ConfigGo()
	if err != nil || !strings.Contains(src, "Trial int `json:\"trial\"`") || !strings.Contains(src, "FileOnly bool `json:\"fileOnly\"`") {
		t.Errorf("config structs: %v\n%s", err, src)
	}
	if err := Check("limits.trial", "0"); !errors.Is(err, ErrRange) {
		t.Errorf("limits.trial=0: %v, want out of range", err)
	}
	if err := Check("limits.fileOnly", "yes"); !errors.Is(err, ErrSyntax) {
		t.Errorf("limits.fileOnly=yes: %v, want malformed", err)
	}
}

// A default that YAML would read as another type (on: a bool, 1.5: a
// number) is quoted in the generated files, so the file and the chart's
// values give the agent the key's text.
func TestGeneratedDefaultsStayText(t *testing.T) {
	saved := Keys
	t.Cleanup(func() { Keys = saved })
	for _, v := range []string{"on", "No", "null", "~", "1.5", "0x10", "1e3", "a: b", "#x", "- x", "250m=4,1=2", "100ms"} {
		Keys = []Key{{Name: "pool.switch", Flag: "switch", Kind: KindChoice, Choices: []string{v}, Doc: "a switch",
			get: func(Pool) string { return v }, set: func(*Pool, string) error { return nil }}}
		var got map[string]map[string]any
		if err := yaml.Unmarshal([]byte(SectionsYAML()), &got); err != nil {
			t.Errorf("%q: %v\n%s", v, err, SectionsYAML())
			continue
		}
		if s, ok := got["pool"]["switch"].(string); !ok || s != v {
			t.Errorf("%q reads back as %#v:\n%s", v, got["pool"]["switch"], SectionsYAML())
		}
	}
}
