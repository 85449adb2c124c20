package settings

import (
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
	if got := strings.Join(Sections(), ","); got != "pool,admission" {
		t.Fatalf("sections %s, want pool,admission", got)
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
