package settings

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/format"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Target is a file written from Keys (wholly, or between its markers) by
// `make settings-doc`; TestGenerated fails when one is stale.
type Target struct {
	// Path is relative to the repository's root.
	Path string
	// Rewrite returns the file's text with the generated part made anew.
	Rewrite func(old string) (string, error)
}

// Targets are every file that writes out the settings: a new Key is one
// edit in Keys, and `make settings-doc` carries it to all of them.
var Targets = []Target{
	{"docs/settings.md", RewriteDoc},
	{"charts/cpuslot/templates/_helpers.tpl", RewriteChartConfig},
	{"charts/cpuslot/values.yaml", func(s string) (string, error) { return rewrite(s, yamlBegin, yamlEnd, ChartValuesYAML()) }},
	{"docs/agent.example.yaml", func(s string) (string, error) { return rewrite(s, yamlBegin, yamlEnd, SectionsYAML()) }},
	{"charts/cpuslot/values.schema.json", RewriteSchema},
	{"charts/cpuslot/README.md", readmeTarget},
	{"internal/agent/config_settings.go", func(string) (string, error) { return ConfigGo() }},
}

// The markers of the generated parts of YAML files and of the chart's
// README (generated and read by hand alike, so the text around them stays
// prose written by hand).
const (
	yamlBegin = "# BEGIN generated from internal/settings by `make settings-doc`; do not edit\n"
	yamlEnd   = "# END generated\n"
)

func readmeTarget(s string) (string, error) { return rewrite(s, docBegin, docEnd, ReadmeRows()) }

// Sections are the sections of the file's keys ("pool", "admission",
// "limits"), in the order of their first key in FileKeys; a file lists
// each section's keys together.
func Sections() []string {
	var out []string
	for _, k := range FileKeys() {
		if !slices.Contains(out, k.Section()) {
			out = append(out, k.Section())
		}
	}
	return out
}

// Section is the key's section in the file: "pool" for "pool.maxSlots".
func (k Key) Section() string { sec, _, _ := strings.Cut(k.Name, "."); return sec }

// Field is the key's name within its section: "maxSlots".
func (k Key) Field() string { _, f, _ := strings.Cut(k.Name, "."); return f }

// commentWidth is where the generated YAML comments wrap.
const commentWidth = 80

// SectionsYAML is every key of the file with its default and its Doc as
// a comment, in the form of the agent's file.
func SectionsYAML() string { return sectionsYAML(FileKeys()) }

// ChartValuesYAML is SectionsYAML of the keys that are chart values: the
// chart's values have the file's form.
func ChartValuesYAML() string { return sectionsYAML(chartKeys()) }

// chartKeys are the file's keys that are values of the chart.
func chartKeys() []Key {
	return slices.DeleteFunc(FileKeys(), func(k Key) bool { return k.NoChart })
}

func sectionsYAML(keys []Key) string {
	var b strings.Builder
	for i, sec := range Sections() {
		if i > 0 {
			b.WriteString("\n")
		}
		if doc := sectionDocs[sec]; doc != "" {
			b.WriteString(comment("", 0, doc))
		}
		b.WriteString(sec + ":\n")
		var lines [][2]string
		col := 0
		for _, k := range keys {
			if k.Section() == sec {
				l := "  " + k.Field() + ": " + k.yamlDefault()
				lines = append(lines, [2]string{l, k.Doc})
				col = max(col, len(l)+2)
			}
		}
		for _, l := range lines {
			b.WriteString(comment(l[0], col, l[1]))
		}
	}
	return b.String()
}

// comment writes line with text as a comment starting at column col,
// wrapped at commentWidth onto lines that start the comment at col too.
func comment(line string, col int, text string) string {
	var b strings.Builder
	cur := line + strings.Repeat(" ", col-len(line)) + "#"
	for _, w := range strings.Fields(text) {
		if len(cur)+1+len(w) > commentWidth && !strings.HasSuffix(cur, "#") {
			b.WriteString(cur + "\n")
			cur = strings.Repeat(" ", col) + "#"
		}
		cur += " " + w
	}
	b.WriteString(cur + "\n")
	return b.String()
}

// yamlDefault is the key's default as a YAML scalar: a number as it is,
// text plain where YAML reads it back as that text, else quoted.
func (k Key) yamlDefault() string {
	v := k.DefaultText()
	switch k.Kind {
	case KindInt, KindNumber, KindFraction, KindBool:
		return v
	case KindDuration:
		dur, _ := time.ParseDuration(v)
		v = ShortDuration(dur)
	}
	var back map[string]any
	if err := yaml.Unmarshal([]byte("v: "+v), &back); err == nil && back["v"] == v {
		return v
	}
	return strconv.Quote(v)
}

// ReadmeRows are the rows of the chart README's values table for the keys.
func ReadmeRows() string {
	var b strings.Builder
	b.WriteString("| value | default | meaning |\n|---|---|---|\n")
	for _, k := range chartKeys() {
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", k.Name, k.yamlDefault(), k.Doc)
	}
	return b.String()
}

// schemaProp is a property of the chart's values.schema.json, its fields
// in the order the file writes them.
type schemaProp struct {
	Type             string       `json:"type,omitempty"`
	Enum             []string     `json:"enum,omitempty"`
	Pattern          string       `json:"pattern,omitempty"`
	MaxLength        *int         `json:"maxLength,omitempty"`
	Minimum          *float64     `json:"minimum,omitempty"`
	ExclusiveMinimum *float64     `json:"exclusiveMinimum,omitempty"`
	Maximum          *float64     `json:"maximum,omitempty"`
	Description      string       `json:"description,omitempty"`
	AnyOf            []schemaProp `json:"anyOf,omitempty"`
}

// The patterns of the schema: what ParseQuota, ParsePrewarm and
// time.ParseDuration read (TestSchemaMatchesSettings tries them).
const (
	quantityPattern = `([0-9]+m|[0-9]+(\.[0-9]{1,3})?|\.[0-9]{1,3})`
	prewarmPattern  = "^(" + quantityPattern + "=[0-9]+(," + quantityPattern + "=[0-9]+)*)?$"
	durationPattern = `^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
)

// schema is the key's property in the chart's values schema.
func (k Key) schema() schemaProp {
	num := func(f float64) *float64 { return &f }
	p := schemaProp{Type: "string", Description: k.Doc}
	switch k.Kind {
	case KindPrewarm:
		p.Pattern = prewarmPattern
	case KindChoice:
		p.Enum = k.Choices
	case KindDuration:
		p.Pattern = durationPattern
		p.Description += " (Go duration: 100ms, 2m, 1h30m)"
	case KindInt:
		p.Type, p.Minimum = "integer", num(k.Min)
	case KindNumber:
		p.Type, p.ExclusiveMinimum = "number", num(k.Min)
	case KindFraction:
		p.Type, p.Minimum = "number", num(k.Min)
	case KindBool:
		p.Type = "boolean"
	case KindQuantity:
		p.Type = ""
		p.Description += " (CPU quantity: 250m, 1, 1.5)"
		if k.Optional {
			p.AnyOf = append(p.AnyOf, schemaProp{Type: "string", MaxLength: new(int)})
		}
		p.AnyOf = append(p.AnyOf, schemaProp{Type: "string", Pattern: "^" + quantityPattern + "$"},
			schemaProp{Type: "number", ExclusiveMinimum: num(0)})
	}
	if k.Kind == KindInt || k.Kind == KindNumber || k.Kind == KindFraction {
		if k.Max != noMax {
			p.Maximum = num(k.Max)
		}
	}
	return p
}

// SchemaSection is a section's object in the chart's values schema: its
// keys' properties, each required, and no others.
func SchemaSection(sec string) ([]byte, error) {
	var props []string
	var required []string
	for _, k := range chartKeys() {
		if k.Section() != sec {
			continue
		}
		b, err := marshal(k.schema())
		if err != nil {
			return nil, err
		}
		name, _ := marshal(k.Field())
		props = append(props, string(name)+":"+string(b))
		required = append(required, k.Field())
	}
	req, err := marshal(required)
	if err != nil {
		return nil, err
	}
	// encoding/json sorts a map's keys; the properties keep the keys' order.
	raw := `{"type":"object","properties":{` + strings.Join(props, ",") + `},"additionalProperties":false,"required":` + string(req) + `}`
	var out bytes.Buffer
	if err := json.Indent(&out, []byte(raw), "    ", "  "); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// RewriteSchema returns the chart's values.schema.json with the object of
// each section of the keys (a top-level property) made anew; JSON has no
// comments to mark it, so the object is found by its first line and the
// line that closes it at the same indent.
func RewriteSchema(file string) (string, error) {
	for _, sec := range Sections() {
		open := "\n    \"" + sec + "\": {\n"
		i := strings.Index(file, open)
		if i < 0 {
			return "", fmt.Errorf("%w: want a top-level property %q", ErrNoDocMarkers, sec)
		}
		start := i + len("\n    \""+sec+"\": ")
		end := strings.Index(file[start:], "\n    }")
		if end < 0 {
			return "", fmt.Errorf("%w: the property %q is not closed", ErrNoDocMarkers, sec)
		}
		end += start + len("\n    }")
		obj, err := SchemaSection(sec)
		if err != nil {
			return "", err
		}
		file = file[:start] + string(obj) + file[end:]
	}
	return file, nil
}

// ConfigGo is the Go source of the agent file's sections of the keys
// (internal/agent): a struct per section whose fields are the keys, each
// tagged with its name, of the type the key's kind reads into, and read
// through the settings' parser (decodeSection, config.go).
func ConfigGo() (string, error) {
	var b strings.Builder
	b.WriteString("// Code generated from internal/settings by `make settings-doc`. DO NOT EDIT.\n\npackage agent\n")
	b.WriteString("\n// settingsSections are the file's sections of settings.FileKeys, in Config.\ntype settingsSections struct {\n")
	for _, sec := range Sections() {
		fmt.Fprintf(&b, "\t%s %sConfig `json:\"%s\"`\n", exported(sec), exported(sec), sec)
	}
	b.WriteString("}\n")
	for _, sec := range Sections() {
		typ := exported(sec) + "Config"
		fmt.Fprintf(&b, "\n// %s is the file's %s section: one field per key of settings.FileKeys.\ntype %s struct {\n", typ, sec, typ)
		for _, k := range FileKeys() {
			if k.Section() == sec {
				fmt.Fprintf(&b, "\t// %s\n\t%s %s `json:\"%s\"`\n", k.Doc, exported(k.Field()), k.goType(), k.Field())
			}
		}
		b.WriteString("}\n")
		fmt.Fprintf(&b, "\nfunc (s *%s) field(key string) any { return sectionField(s, %q, key) }\n", typ, sec)
		fmt.Fprintf(&b, "\n// UnmarshalJSON reads the section through the settings' parser.\nfunc (s *%s) UnmarshalJSON(b []byte) error { return decodeSection(b, %q, s.field) }\n", typ, sec)
	}
	src, err := format.Source([]byte(b.String()))
	return string(src), err
}

func exported(s string) string { return strings.ToUpper(s[:1]) + s[1:] }

// goType is the type of the key's field in the agent's file.
func (k Key) goType() string {
	switch k.Kind {
	case KindDuration:
		return "Duration"
	case KindInt:
		return "int"
	case KindNumber, KindFraction:
		return "float64"
	case KindBool:
		return "bool"
	}
	return "string"
}
