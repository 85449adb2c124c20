package settings_test

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// Every default survives a trip through Get and Set, so the file's
// defaults (written with Get) mean what Default means.
func TestDefaultsRoundTrip(t *testing.T) {
	d := settings.Default()
	for _, k := range settings.Keys {
		s := settings.Default()
		if err := s.Set(k.Name, d.Get(k.Name)); err != nil {
			t.Errorf("%s: default %q refused: %v", k.Name, d.Get(k.Name), err)
		} else if s.Get(k.Name) != d.Get(k.Name) {
			t.Errorf("%s: %q became %q", k.Name, d.Get(k.Name), s.Get(k.Name))
		}
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestSetRefusalChangesNothing(t *testing.T) {
	s := settings.Default()
	before := s.Get("admission.overcommit")
	err := s.Set("admission.overcommit", "1000")
	var se *settings.Error
	if !errors.As(err, &se) || se.Key != "admission.overcommit" || se.Value != "1000" || !errors.Is(err, settings.ErrRange) {
		t.Fatalf("got %v", err)
	}
	if s.Get("admission.overcommit") != before {
		t.Fatalf("refused value stored: %v", s.Overcommit)
	}
	if err := s.Set("pool.prewarm", "250m=1,250m=2"); err == nil || s.Get("pool.prewarm") != settings.Default().Get("pool.prewarm") {
		t.Fatalf("duplicate quota: %v, prewarm now %q", err, s.Get("pool.prewarm"))
	}
	if err := s.Set("pool.turbo", "1"); !errors.Is(err, settings.ErrUnknownKey) {
		t.Fatalf("unknown key: %v", err)
	}
}

func TestRanges(t *testing.T) {
	for _, c := range []struct {
		key, value string
		ok         bool
	}{
		{"pool.period", "1ms", true}, {"pool.period", "1s", true}, {"pool.period", "999us", false}, {"pool.period", "2s", false},
		{"pool.maxSlots", "1", true}, {"pool.maxSlots", "4096", true}, {"pool.maxSlots", "4097", false},
		{"pool.maxActions", "1", true}, {"pool.maxActions", "0", false},
		{"pool.idleTimeout", "0s", true}, {"pool.idleTimeout", "-1s", false},
		{"pool.maxWait", "-5ms", false}, {"pool.defaultWait", "-5ms", false},
		{"admission.overcommit", "0.01", true}, {"admission.overcommit", "NaN", false}, {"admission.overcommit", "+Inf", false},
		{"admission.budget", "", true}, {"pool.maxQuota", "", true}, {"admission.minDegraded", "", false},
		{"admission.minDegraded", "0", false}, {"pool.prewarm", "", true},
		{"admission.policy", "", false}, {"pool.mode", "", false},
		{"admission.lendRatio", "0", true}, {"admission.lendRatio", "1", true}, {"admission.lendRatio", "0.5", true},
		{"admission.lendRatio", "1.01", false}, {"admission.lendRatio", "-0.1", false}, {"admission.lendRatio", "NaN", false},
		{"admission.lendRatio", "", false},
	} {
		s := settings.Default()
		if err := s.Set(c.key, c.value); (err == nil) != c.ok {
			t.Errorf("%s=%q: err %v, want ok=%v", c.key, c.value, err, c.ok)
		}
	}
}

// The settings' choices are the names pool, admission and cgroup use, in
// the order they number them.
func TestChoicesMatchConsumers(t *testing.T) {
	for _, name := range settings.Modes {
		m, err := settings.ParseMode(name)
		if err != nil || string(m) != name {
			t.Errorf("mode %s: %v %v", name, m, err)
		}
	}
	for _, name := range settings.Policies {
		p, err := admission.ParsePolicy(name)
		if err != nil || string(p) != name {
			t.Errorf("policy %s: %v %v", name, p, err)
		}
	}
	for _, name := range settings.Limits {
		l, err := cgroup.ParseLimit(name)
		if err != nil || l.String() != name {
			t.Errorf("limit %s: %v %v", name, l, err)
		}
	}
}

// Each key has one flag and at most one annotation, none shared.
func TestNamesUnique(t *testing.T) {
	seen := map[string]string{}
	for _, k := range settings.Keys {
		if k.Flag == "" {
			t.Errorf("%s has no flag", k.Name)
		}
		names := []string{k.Name, "--" + k.Flag}
		if k.Annotation != "" {
			names = append(names, "annotation "+k.Annotation)
		}
		for _, n := range names {
			if other, dup := seen[n]; dup {
				t.Errorf("%s used by %s and %s", n, other, k.Name)
			}
			seen[n] = k.Name
		}
	}
}

// docs/settings.md's pool and admission table lists every key with its
// flag, annotation and chart value, and nothing the table does not have.
func TestReadmeTable(t *testing.T) {
	b, err := os.ReadFile("../../docs/settings.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 9 || !(strings.HasPrefix(cells[1], " `pool.") || strings.HasPrefix(cells[1], " `admission.")) {
			continue // not a row of | setting | flag | annotation | chart value | default | accepts | meaning |
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows[strings.Trim(cells[1], "`")] = cells[2:5]
	}
	for _, k := range settings.Keys {
		row, ok := rows[k.Name]
		if !ok {
			t.Errorf("docs/settings.md: no row for %s", k.Name)
			continue
		}
		ann := ""
		if k.Annotation != "" {
			ann = "`cpuslot.dev/" + k.Annotation + "`"
		}
		if row[0] != "`--"+k.Flag+"`" || row[1] != ann || row[2] != "`"+k.Name+"`" {
			t.Errorf("docs/settings.md: %s has flag %s, annotation %q, chart value %s; want -%s, %q, %s",
				k.Name, row[0], row[1], row[2], k.Flag, ann, k.Name)
		}
		delete(rows, k.Name)
	}
	for name := range rows {
		t.Errorf("docs/settings.md: row %q is no setting", name)
	}
}

// Validate refuses a Pool built in code (not through Set) with values Set
// would refuse: pool.New relies on it.
func TestValidateBuiltInCode(t *testing.T) {
	for name, mutate := range map[string]func(*settings.Pool){
		"mode":           func(p *settings.Pool) { p.Mode = "turbo" },
		"policy":         func(p *settings.Pool) { p.Policy = "drop" },
		"maxSlots":       func(p *settings.Pool) { p.MaxSlots = 0 },
		"maxActions":     func(p *settings.Pool) { p.MaxActions = 0 },
		"overcommit":     func(p *settings.Pool) { p.Overcommit = -1 },
		"lendRatio":      func(p *settings.Pool) { p.LendRatio = 1.5 },
		"lendRatio NaN":  func(p *settings.Pool) { p.LendRatio = math.NaN() },
		"wait":           func(p *settings.Pool) { p.DefaultWait = -time.Millisecond },
		"negative count": func(p *settings.Pool) { p.Prewarm = map[uint32]int{250: -1} },
		"maxQuota":       func(p *settings.Pool) { p.MaxQuotaMilli = 2_000_000 },
	} {
		p := settings.Default()
		mutate(&p)
		if err := p.Validate(); err == nil {
			t.Errorf("%s: %+v accepted", name, p)
		}
	}
	if err := settings.Default().Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
}

// TestGenerated: every file written from Keys (Targets: the docs' table,
// the chart's values, schema, README rows and configuration template, the
// example file, the agent file's structs) is what `make settings-doc`
// writes now.
func TestGenerated(t *testing.T) {
	for _, g := range settings.Targets {
		b, err := os.ReadFile(filepath.Join("../..", g.Path))
		if err != nil {
			t.Fatal(err)
		}
		want, err := g.Rewrite(string(b))
		if err != nil {
			t.Fatalf("%s: %v", g.Path, err)
		}
		if string(b) != want {
			t.Errorf("%s is stale: run make settings-doc", g.Path)
		}
	}
}

// A section of the keys is written only by the generator: a new key's
// section must not be a name the chart's values or the example file use
// by hand (the chart's nri, kubernetes), or the file would hold it
// twice.
func TestSectionsNotWrittenByHand(t *testing.T) {
	for _, path := range []string{"charts/cpuslot/values.yaml", "docs/agent.example.yaml"} {
		b, err := os.ReadFile(filepath.Join("../..", path))
		if err != nil {
			t.Fatal(err)
		}
		head, rest, _ := strings.Cut(string(b), "# BEGIN generated")
		_, tail, _ := strings.Cut(rest, "# END generated\n")
		for _, sec := range settings.Sections() {
			for _, text := range []string{head, tail} {
				if strings.HasPrefix(text, sec+":") || strings.Contains(text, "\n"+sec+":") {
					t.Errorf("%s: %s is a section of settings.Keys, and also written by hand", path, sec)
				}
			}
		}
	}
}

func TestRewriteDocNeedsMarkers(t *testing.T) {
	if _, err := settings.RewriteDoc("# Settings\n"); !errors.Is(err, settings.ErrNoDocMarkers) {
		t.Fatalf("got %v", err)
	}
}
