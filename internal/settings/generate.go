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

// Sections are the top-level sections of the file's keys ("pool",
// "admission", "limits", "kubernetes"), in the order of their first key in
// FileKeys; a file lists each section's keys together.
func Sections() []string { return fileTree().maps("") }

// Field is the key's name within its section: "maxSlots".
func (k Key) Field() string { return leaf(k.Name) }

// chartPath is the key's path in the chart's values.
func (k Key) chartPath() string {
	if k.Chart != "" {
		return k.Chart
	}
	return k.Name
}

// parent is the path of the section holding path ("" at the top); leaf
// its last name.
func parent(path string) string {
	i := strings.LastIndex(path, ".")
	if i < 0 {
		return ""
	}
	return path[:i]
}

func leaf(path string) string { return path[strings.LastIndex(path, ".")+1:] }

// tree is keys as a file nests them by path (the file's, or the chart's
// values').
type tree struct {
	keys []Key
	path func(Key) string
}

func fileTree() tree  { return tree{FileKeys(), func(k Key) string { return k.Name }} }
func chartTree() tree { return tree{chartKeys(), Key.chartPath} }

// leaves are the keys directly in the section at (at "": the top).
func (t tree) leaves(at string) []Key {
	var out []Key
	for _, k := range t.keys {
		if parent(t.path(k)) == at {
			out = append(out, k)
		}
	}
	return out
}

// maps are the paths of the sections directly in the section at, in the
// order of their first key; the files write a section's keys first, then
// its sections.
func (t tree) maps(at string) []string {
	prefix := at + "."
	if at == "" {
		prefix = ""
	}
	var out []string
	for _, k := range t.keys {
		rest, ok := strings.CutPrefix(t.path(k), prefix)
		if name, _, nested := strings.Cut(rest, "."); ok && nested && !slices.Contains(out, prefix+name) {
			out = append(out, prefix+name)
		}
	}
	return out
}

// items are a list's items in Set's syntax.
func (k Key) items(v string) []string {
	if v == "" {
		return []string{}
	}
	return strings.Split(v, ",")
}

// doc is the comment of the section at: sectionDocs of its path in the
// file (the chart's nri is the file's kubernetes.nri).
func (t tree) doc(at string) string {
	for _, k := range t.keys {
		if p := t.path(k); strings.HasPrefix(p, at+".") {
			file := strings.Split(k.Name, ".")
			return sectionDocs[strings.Join(file[:len(file)-strings.Count(p[len(at):], ".")], ".")]
		}
	}
	return ""
}

// commentWidth is where the generated YAML comments wrap; a section
// whose lines reach past maxCommentCol has its comments above its lines.
const (
	commentWidth  = 80
	maxCommentCol = 40
)

// SectionsYAML is every key of the file with its default and its Doc as
// a comment, in the form of the agent's file.
func SectionsYAML() string { return fileTree().yaml() }

// ChartValuesYAML is SectionsYAML of the keys that are chart values: the
// chart's values have the file's form.
func ChartValuesYAML() string { return chartTree().yaml() }

// chartKeys are the file's keys that are values of the chart.
func chartKeys() []Key {
	return slices.DeleteFunc(templateKeys(), func(k Key) bool { return k.ChartFrom != "" })
}

// templateKeys are the file's keys the chart's template writes.
func templateKeys() []Key {
	return slices.DeleteFunc(FileKeys(), func(k Key) bool { return k.NoChart })
}

// yaml is the tree's keys with their defaults, each with its Doc as a
// comment, the top-level sections apart by a blank line.
func (t tree) yaml() string {
	var b strings.Builder
	t.writeYAML(&b, "", "")
	return b.String()
}

func (t tree) writeYAML(b *strings.Builder, at, indent string) {
	var lines [][2]string
	col := 0
	for _, k := range t.leaves(at) {
		l := indent + leaf(t.path(k)) + ": " + k.yamlDefault()
		lines = append(lines, [2]string{l, k.Doc})
		col = max(col, len(l)+2)
	}
	for _, l := range lines {
		if col > maxCommentCol {
			b.WriteString(comment(indent, len(indent), l[1]) + l[0] + "\n")
			continue
		}
		b.WriteString(comment(l[0], col, l[1]))
	}
	for i, m := range t.maps(at) {
		if at == "" && (i > 0 || len(lines) > 0) {
			b.WriteString("\n")
		}
		if doc := t.doc(m); doc != "" {
			b.WriteString(comment(indent, len(indent), doc))
		}
		b.WriteString(indent + leaf(m) + ":\n")
		t.writeYAML(b, m, indent+"  ")
	}
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
	case KindList:
		return "[" + strings.Join(k.items(v), ", ") + "]"
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
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", k.chartPath(), k.yamlDefault(), k.Doc)
	}
	return b.String()
}

// schemaProp is a property of the chart's values.schema.json, its fields
// in the order the file writes them.
type schemaProp struct {
	Type             string       `json:"type,omitempty"`
	UniqueItems      bool         `json:"uniqueItems,omitempty"`
	Items            *schemaProp  `json:"items,omitempty"`
	Enum             []string     `json:"enum,omitempty"`
	Pattern          string       `json:"pattern,omitempty"`
	MinLength        *int         `json:"minLength,omitempty"`
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
		if k.Pattern != "" {
			p.Pattern = k.Pattern
		} else {
			p.Description += " (Go duration: 100ms, 2m, 1h30m)"
		}
	case KindString:
		p.Pattern = k.Pattern
		if k.Min > 0 {
			p.MinLength = new(int(k.Min))
		}
		if k.Max != noMax {
			p.MaxLength = new(int(k.Max))
		}
	case KindList:
		p.Type, p.UniqueItems = "array", true
		p.Items = &schemaProp{Type: "string", Enum: k.Choices}
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

// SchemaSection is a top-level value's property in the chart's values
// schema: a key's, or a section's object of its keys' and sections'
// properties, each required, and no others.
func SchemaSection(name string) ([]byte, error) {
	t := chartTree()
	var raw []byte
	var err error
	if i := slices.IndexFunc(t.keys, func(k Key) bool { return k.chartPath() == name }); i >= 0 {
		raw, err = marshal(t.keys[i].schema())
	} else {
		raw, err = t.schemaObject(name)
	}
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "    ", "  "); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// schemaObject is the section at as an object of the schema.
func (t tree) schemaObject(at string) ([]byte, error) {
	var props, required []string
	add := func(name string, b []byte) {
		n, _ := marshal(name)
		props = append(props, string(n)+":"+string(b))
		required = append(required, name)
	}
	for _, k := range t.leaves(at) {
		b, err := marshal(k.schema())
		if err != nil {
			return nil, err
		}
		add(leaf(t.path(k)), b)
	}
	for _, m := range t.maps(at) {
		b, err := t.schemaObject(m)
		if err != nil {
			return nil, err
		}
		add(leaf(m), b)
	}
	req, err := marshal(required)
	if err != nil {
		return nil, err
	}
	desc := ""
	if doc := t.doc(at); doc != "" {
		d, _ := marshal(doc)
		desc = `"description":` + string(d) + ","
	}
	// encoding/json sorts a map's keys; the properties keep the keys' order.
	return []byte(`{"type":"object",` + desc + `"properties":{` + strings.Join(props, ",") + `},"additionalProperties":false,"required":` + string(req) + `}`), nil
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
	t := chartTree()
	var top []string
	for _, k := range t.leaves("") {
		top = append(top, k.chartPath())
	}
	for _, sec := range append(top, t.maps("")...) {
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
	b.WriteString("\n// settingsSections are the file's keys of settings.FileKeys and their\n// sections, in Config: a top-level key is read as its type reads (and\n// checked with the configuration), a section through the settings' parser.\n")
	fileTree().writeGo(&b, "", "settingsSections")
	src, err := format.Source([]byte(b.String()))
	return string(src), err
}

// writeGo writes the struct typ of the section at: a field per key and
// section, then the structs of its sections.
func (t tree) writeGo(b *strings.Builder, at, typ string) {
	if at != "" {
		fmt.Fprintf(b, "\n// %s is the file's %s section: one field per key of settings.FileKeys.\n", typ, at)
	}
	fmt.Fprintf(b, "type %s struct {\n", typ)
	for _, k := range t.leaves(at) {
		fmt.Fprintf(b, "\t// %s\n\t%s %s `json:\"%s\"`\n", k.Doc, exported(k.Field()), k.goType(), k.Field())
	}
	for _, m := range t.maps(at) {
		fmt.Fprintf(b, "\t%s %s `json:\"%s\"`\n", exported(leaf(m)), goStruct(m), leaf(m))
	}
	b.WriteString("}\n")
	if at != "" {
		fmt.Fprintf(b, "\nfunc (s *%s) field(key string) any { return sectionField(s, %q, key) }\n", typ, at)
		fmt.Fprintf(b, "\n// UnmarshalJSON reads the section through the settings' parser.\nfunc (s *%s) UnmarshalJSON(b []byte) error { return decodeSection(b, %q, s.field) }\n", typ, at)
	}
	for _, m := range t.maps(at) {
		t.writeGo(b, m, goStruct(m))
	}
}

// goStruct is the type of a section's struct: KubernetesConfig for
// "kubernetes", NRIConfig for "kubernetes.nri".
func goStruct(section string) string { return exported(leaf(section)) + "Config" }

// initialisms are names Go writes in capitals.
var initialisms = map[string]string{"http": "HTTP", "nri": "NRI"}

func exported(s string) string {
	if v, ok := initialisms[s]; ok {
		return v
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

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
	case KindList:
		return "[]string"
	}
	return "string"
}
