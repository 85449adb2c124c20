package chart

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cpuslot/cpuslot/internal/settings"
)

// schemaProp is the part of a JSON schema property the settings decide.
type schemaProp struct {
	Type             any          `json:"type"`
	Enum             []string     `json:"enum"`
	Minimum          *float64     `json:"minimum"`
	Maximum          *float64     `json:"maximum"`
	ExclusiveMinimum *float64     `json:"exclusiveMinimum"`
	Pattern          string       `json:"pattern"`
	MaxLength        *int         `json:"maxLength"`
	AnyOf            []schemaProp `json:"anyOf"`
	Properties       map[string]schemaProp
}

// Values each kind is tried with: whatever the agent accepts, the chart's
// schema must accept too.
var samples = map[settings.Kind][]string{
	settings.KindPrewarm:  {"", "250m=4", "250m=4,500m=2,1=2", "0.5=2,1500m=1", "1.5=1", ".25=3", "250m", "-1=2", "x=1", "250m=1;1=2"},
	settings.KindQuantity: {"", "250m", "1", "1.5", "0.25", ".5", "1000", "lots", "-5m", "1e3", "1.2345"},
	settings.KindDuration: {"1ms", "100ms", "1s", "2m", "1h30m", "1.5s", "100", "fast", "2 minutes"},
}

// TestSchemaMatchesSettings: the pool and admission sections of
// values.schema.json name exactly the settings' keys, with their choices
// and numeric ranges, and accept every value the agent accepts.
func TestSchemaMatchesSettings(t *testing.T) {
	b, err := os.ReadFile("values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var root schemaProp
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, k := range settings.Keys {
		section, field, _ := strings.Cut(k.Name, ".")
		p, ok := root.Properties[section].Properties[field]
		if !ok {
			t.Errorf("%s: not in the schema", k.Name)
			continue
		}
		covered[k.Name] = true
		switch k.Kind {
		case settings.KindChoice:
			if !slices.Equal(p.Enum, k.Choices) {
				t.Errorf("%s: schema enum %v, settings %v", k.Name, p.Enum, k.Choices)
			}
		case settings.KindInt:
			if p.Type != "integer" || !eq(p.Minimum, k.Min) || !eq(p.Maximum, k.Max) {
				t.Errorf("%s: schema %v in %v..%v, settings integer %s", k.Name, p.Type, val(p.Minimum), val(p.Maximum), k.RangeText())
			}
		case settings.KindNumber:
			if p.Type != "number" || !eq(p.ExclusiveMinimum, k.Min) || !eq(p.Maximum, k.Max) {
				t.Errorf("%s: schema %v in (%v, %v], settings number %s", k.Name, p.Type, val(p.ExclusiveMinimum), val(p.Maximum), k.RangeText())
			}
		case settings.KindFraction:
			if p.Type != "number" || !eq(p.Minimum, k.Min) || p.Minimum == nil || !eq(p.Maximum, k.Max) {
				t.Errorf("%s: schema %v in [%v, %v], settings number %s", k.Name, p.Type, val(p.Minimum), val(p.Maximum), k.RangeText())
			}
		default:
			for _, v := range samples[k.Kind] {
				s := settings.Default()
				if s.Set(k.Name, v) == nil && !p.accepts(v) {
					t.Errorf("%s: the agent accepts %q, the schema refuses it", k.Name, v)
				}
			}
			if k.Optional != p.accepts("") {
				t.Errorf("%s: empty value optional in settings: %v, in the schema: %v", k.Name, k.Optional, p.accepts(""))
			}
		}
	}
	for _, section := range []string{"pool", "admission"} {
		for field := range root.Properties[section].Properties {
			if !covered[section+"."+field] {
				t.Errorf("schema has %s.%s, the settings have no such key", section, field)
			}
		}
	}
}

// accepts reports whether a string value passes the property's pattern,
// length and alternatives (numbers, for quantities given as numbers,
// are not strings and not tried here).
func (p schemaProp) accepts(v string) bool {
	if len(p.AnyOf) > 0 {
		return slices.ContainsFunc(p.AnyOf, func(q schemaProp) bool { return q.Type == "string" && q.accepts(v) })
	}
	if p.MaxLength != nil && len(v) > *p.MaxLength {
		return false
	}
	return p.Pattern == "" || regexp.MustCompile(p.Pattern).MatchString(v)
}

// eq compares a schema bound with a settings bound (0: none).
func eq(p *float64, want float64) bool {
	if p == nil {
		return want == 0
	}
	return *p == want
}

func val(p *float64) any {
	if p == nil {
		return "none"
	}
	return *p
}

// TestHelpersGenerated: the pool and admission sections of the agent's
// configuration in templates/_helpers.tpl are what `make settings-doc`
// writes from the settings' keys.
func TestHelpersGenerated(t *testing.T) {
	b, err := os.ReadFile("templates/_helpers.tpl")
	if err != nil {
		t.Fatal(err)
	}
	want, err := settings.RewriteChartConfig(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Errorf("templates/_helpers.tpl is stale: run make settings-doc")
	}
}
