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
	if got := strings.Join(Sections(), ","); got != "pool,admission,limits,kubernetes" {
		t.Fatalf("sections %s, want pool,admission,limits,kubernetes", got)
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
		var got struct{ Pool map[string]any }
		if err := yaml.Unmarshal([]byte(SectionsYAML()), &got); err != nil {
			t.Errorf("%q: %v\n%s", v, err, SectionsYAML())
			continue
		}
		if s, ok := got.Pool["switch"].(string); !ok || s != v {
			t.Errorf("%q reads back as %#v:\n%s", v, got.Pool["switch"], SectionsYAML())
		}
	}
}

// A key added to AgentKeys at any depth, under a chart path of its own,
// is written in every file: the file's example and structs at its path,
// the chart's values, schema, README rows and template at its chart path,
// its docs table; a top-level key and a list alike.
func TestGeneratedNestedKeyReachesEveryFile(t *testing.T) {
	saved := AgentKeys
	t.Cleanup(func() { AgentKeys = saved })
	AgentKeys = append(AgentKeys[:len(AgentKeys):len(AgentKeys)],
		Key{Name: "kubernetes.nri.knob", Chart: "nri.knob", Kind: KindInt, Min: 1, Default: "3", Doc: "a nested knob"},
		Key{Name: "kubernetes.extra.kinds", Kind: KindList, Choices: []string{"a", "b"}, Default: "a", Doc: "a list"},
		Key{Name: "topKnob", Flag: "top-knob", Kind: KindString, Pattern: "^/", Default: "/x", Doc: "a top-level knob"})
	section := func(text, head string) string { _, s, _ := strings.Cut(text, head); return s }
	file := SectionsYAML()
	if !strings.Contains(section(section(file, "kubernetes:\n"), "  nri:\n"), "    knob: 3") ||
		!strings.Contains(section(section(file, "kubernetes:\n"), "  extra:\n"), "    kinds: [a]") ||
		!strings.HasPrefix(file, "topKnob: /x") && !strings.Contains(file, "\ntopKnob: /x") {
		t.Errorf("the file's example:\n%s", file)
	}
	var values struct {
		TopKnob    *string
		NRI        map[string]any `json:"nri"`
		Kubernetes map[string]any
	}
	if err := yaml.Unmarshal([]byte(ChartValuesYAML()), &values); err != nil || values.NRI["knob"] != float64(3) ||
		values.Kubernetes["extra"].(map[string]any)["kinds"].([]any)[0] != "a" || values.TopKnob == nil {
		t.Errorf("chart values: %v %+v\n%s", err, values, ChartValuesYAML())
	}
	tpl := ChartConfig()
	for _, want := range []string{"\n    knob: {{ int .Values.nri.knob }}\n", "\n    kinds: {{ toJson .Values.kubernetes.extra.kinds }}\n", "topKnob: {{ .Values.topKnob | quote }}\n"} {
		if !strings.Contains(tpl, want) {
			t.Errorf("template without %q:\n%s", want, tpl)
		}
	}
	for name, want := range map[string]string{"nri": `"knob": {`, "kubernetes": `"uniqueItems": true`, "topKnob": `"pattern": "^/"`} {
		if schema, err := SchemaSection(name); err != nil || !strings.Contains(string(schema), want) {
			t.Errorf("schema of %s: %v\n%s", name, err, schema)
		}
	}
	for _, want := range []string{"| `nri.knob` | `3` |", "| `kubernetes.extra.kinds` | `[a]` |", "| `topKnob` | `/x` |"} {
		if !strings.Contains(ReadmeRows(), want) {
			t.Errorf("README rows without %q:\n%s", want, ReadmeRows())
		}
	}
	if !strings.Contains(AgentDocTable("kubernetes"), "| `kubernetes.nri.knob` | | `nri.knob` | 3 |") ||
		!strings.Contains(AgentDocTable(""), "| `topKnob` | `--top-knob` | `topKnob` |") {
		t.Errorf("docs tables:\n%s\n%s", AgentDocTable("kubernetes"), AgentDocTable(""))
	}
	src, err := ConfigGo()
	words := strings.Join(strings.Fields(src), " ") // gofmt aligns the fields
	for _, want := range []string{"Knob int `json:\"knob\"`", "Extra ExtraConfig `json:\"extra\"`", "Kinds []string `json:\"kinds\"`", "TopKnob string `json:\"topKnob\"`"} {
		if err != nil || !strings.Contains(words, want) {
			t.Errorf("config structs without %q: %v\n%s", want, err, src)
		}
	}
	for key, bad := range map[string]string{"kubernetes.nri.knob": "0", "kubernetes.extra.kinds": "a,a", "topKnob": "x"} {
		if Check(key, bad) == nil {
			t.Errorf("%s=%s accepted", key, bad)
		}
	}
}

// A Rule refuses what no single value shows: kubernetes.nri.startTimeout
// only matters, and must be below the runtime's timeout, when NRI is on.
func TestRuleChecksAcrossSettings(t *testing.T) {
	values := map[string]string{"kubernetes.nri.enabled": "true", "kubernetes.nri.startTimeout": "2s"}
	get := func(key string) string { return values[key] }
	var se *Error
	if err := CheckRules(get); !errors.As(err, &se) || se.Key != "kubernetes.nri.startTimeout" || !errors.Is(err, ErrRange) {
		t.Errorf("2s with NRI on: %v", err)
	}
	values["kubernetes.nri.enabled"] = "false"
	if err := CheckRules(get); err != nil {
		t.Errorf("2s with NRI off: %v", err)
	}
}
