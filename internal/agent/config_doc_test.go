package agent

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/settings"
)

// fileSetting is one leaf of the agent's file: its dotted name and default.
type fileSetting struct {
	name string
	def  any
}

// fileSettings walks Config as the file names its fields (embedded
// sections flattened, nested sections dotted).
func fileSettings(v reflect.Value, prefix string) []fileSetting {
	var out []fileSetting
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		fv := v.Field(i)
		switch {
		case f.Anonymous:
			out = append(out, fileSettings(fv, prefix)...)
		case name == "" || name == "-" || name == "apiVersion" || name == "kind":
		case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[Duration]():
			out = append(out, fileSettings(fv, prefix+name+".")...)
		default:
			out = append(out, fileSetting{prefix + name, fv.Interface()})
		}
	}
	return out
}

// defaultText is how docs/settings.md writes a default, "" when the row
// words it instead (an empty string: "none", "the service account", ...).
func defaultText(v any) string {
	switch d := v.(type) {
	case string:
		return d
	case Duration:
		return settings.ShortDuration(d.Duration)
	case time.Duration:
		return settings.ShortDuration(d)
	case []string:
		if len(d) == 0 {
			return "[]"
		}
		return "[" + strings.Join(d, ", ") + "]"
	case []int:
		if len(d) == 0 {
			return "[]"
		}
	case bool, int, float64:
		return fmt.Sprint(d)
	}
	return ""
}

// Every field of the agent's file, the hand-written sections too, has its
// row in docs/settings.md showing its default, and its key in
// docs/agent.example.yaml: a field added to Config without them fails here.
func TestEveryFileSettingIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/settings.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("../../docs/agent.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		if name, ok := strings.CutPrefix(line, "| `"); ok {
			if name, _, ok := strings.Cut(name, "` |"); ok {
				rows[name] = line
			}
		}
	}
	settings := fileSettings(reflect.ValueOf(DefaultConfig()), "")
	if len(settings) < 40 {
		t.Fatalf("found only %d settings in Config: the walk is broken", len(settings))
	}
	for _, s := range settings {
		row, ok := rows[s.name]
		if !ok {
			t.Errorf("%s: no row in docs/settings.md", s.name)
			continue
		}
		cells := strings.Split(row, " | ")
		if want := defaultText(s.def); want != "" && !strings.Contains(strings.ReplaceAll(strings.Join(cells[1:], " | "), "`", ""), want) {
			t.Errorf("%s: its row in docs/settings.md does not show the default %q: %s", s.name, want, row)
		}
		leaf := s.name[strings.LastIndex(s.name, ".")+1:]
		if !strings.Contains(string(example), leaf+":") {
			t.Errorf("%s: not in docs/agent.example.yaml", s.name)
		}
	}
}
