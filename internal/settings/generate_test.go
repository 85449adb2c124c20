package settings

import (
	"strconv"
	"strings"
	"testing"
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
