package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cpuslot/cpuslot/internal/agent"
	k8sdiscover "github.com/cpuslot/cpuslot/internal/discover/kubernetes"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// source sets one setting the way a user would: a flag, a line of the YAML
// file, or a pod annotation. Each returns the error the user would see.
type source struct {
	name string
	set  func(t *testing.T, k settings.Key, v string) error
}

var sources = []source{
	{"flag", func(t *testing.T, k settings.Key, v string) error {
		_, _, err := parseRun([]string{"--" + k.Flag + "=" + v})
		return err
	}},
	{"file", func(t *testing.T, k settings.Key, v string) error {
		section, field, _ := strings.Cut(k.Name, ".")
		p := filepath.Join(t.TempDir(), "agent.yaml")
		if err := os.WriteFile(p, []byte(section+":\n  "+field+": "+v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := agent.LoadConfig(p)
		if err == nil {
			_, err = c.Settings()
		}
		return err
	}},
	{"annotation", func(t *testing.T, k settings.Key, v string) error {
		_, errs := k8sdiscover.PoolConfig(settings.Default(), settings.Ceilings{}, map[string]string{settings.AnnotationPrefix + k.Annotation: v}, 0)
		return errors.Join(errs...)
	}},
}

// TestBadValuesSameFromEverySource: the same bad value is refused by a
// flag, the file and an annotation alike, with an *settings.Error that
// names the key and says what kind of mistake it is.
func TestBadValuesSameFromEverySource(t *testing.T) {
	quiet(t)
	bad := []struct {
		key, value string
		kind       error
	}{
		{"admission.overcommit", "0", settings.ErrRange},
		{"admission.overcommit", "-1", settings.ErrRange},
		{"admission.overcommit", "101", settings.ErrRange},
		{"admission.overcommit", "lots", settings.ErrSyntax},
		{"admission.lendRatio", "2", settings.ErrRange},
		{"admission.lendRatio", "-1", settings.ErrRange},
		{"admission.lendRatio", "half", settings.ErrSyntax},
		{"pool.maxSlots", "0", settings.ErrRange},
		{"pool.maxSlots", "5000", settings.ErrRange},
		{"pool.maxSlots", "many", settings.ErrSyntax},
		{"pool.mode", "turbo", settings.ErrChoice},
		{"pool.limit", "hard", settings.ErrChoice},
		{"admission.policy", "drop", settings.ErrChoice},
		{"admission.budget", "-1", settings.ErrRange},
		{"admission.budget", "two", settings.ErrSyntax},
		{"pool.prewarm", "250m", settings.ErrSyntax},
		{"pool.prewarm", "-1=2", settings.ErrRange},
		{"limits.maxConnections", "0", settings.ErrRange},
		{"limits.maxConnectionsPerProcess", "many", settings.ErrSyntax},
		{"limits.hostNamespaceFDs", "maybe", settings.ErrSyntax},
	}
	for _, b := range bad {
		k, ok := settings.FileKey(b.key)
		if !ok {
			t.Fatalf("no key %s", b.key)
		}
		for _, src := range sources {
			if src.name == "annotation" && k.Annotation == "" {
				continue
			}
			err := src.set(t, k, b.value)
			var se *settings.Error
			switch {
			case err == nil:
				t.Errorf("%s %s=%q: accepted", src.name, b.key, b.value)
			case !errors.As(err, &se) || se.Key != b.key:
				t.Errorf("%s %s=%q: %v: want a *settings.Error for key %s", src.name, b.key, b.value, err, b.key)
			case !errors.Is(err, b.kind):
				t.Errorf("%s %s=%q: %v: want %v", src.name, b.key, b.value, err, b.kind)
			default:
				t.Logf("%s: %v", src.name, err)
			}
		}
	}
}

// TestGoodValuesSameFromEverySource: what one source accepts, all accept,
// with the same result.
func TestGoodValuesSameFromEverySource(t *testing.T) {
	good := map[string]string{
		"admission.overcommit": "100", "pool.maxSlots": "4096", "pool.mode": "cache-lazy",
		"pool.limit": "both", "admission.policy": "reject", "admission.budget": "1.5", "pool.prewarm": "500m=2",
		"admission.lendRatio": "0.5",
	}
	for key, v := range good {
		k, _ := settings.Lookup(key)
		want := settings.Default()
		if err := want.Set(key, v); err != nil {
			t.Fatalf("%s=%q: %v", key, v, err)
		}
		for _, src := range sources {
			if err := src.set(t, k, v); err != nil {
				t.Errorf("%s %s=%q: %v", src.name, key, v, err)
			}
		}
		cfg, _, err := parseRun([]string{"--" + k.Flag + "=" + v})
		if err != nil {
			t.Fatal(err)
		}
		got, err := cfg.Settings()
		if err != nil || got.Get(key) != want.Get(key) {
			t.Errorf("flag %s=%q: got %q (%v), want %q", key, v, got.Get(key), err, want.Get(key))
		}
		ann, _ := k8sdiscover.PoolConfig(settings.Default(), settings.Ceilings{}, map[string]string{settings.AnnotationPrefix + k.Annotation: v}, 0)
		if ann.Get(key) != want.Get(key) {
			t.Errorf("annotation %s=%q: got %q, want %q", key, v, ann.Get(key), want.Get(key))
		}
	}
}

// The agent-wide keys' flags set the file's fields, over the file; a bool
// one alone means true.
func TestAgentKeyFlags(t *testing.T) {
	p := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(p, []byte("limits:\n  maxConnections: 9\n  maxConnectionsPerProcess: 8\n"), 0o600)
	cfg, _, err := parseRun([]string{"--config", p, "--max-connections", "7", "--host-namespace-fds"})
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.Limits; l.MaxConnections != 7 || l.MaxConnectionsPerProcess != 8 || !l.HostNamespaceFDs {
		t.Fatalf("%+v", l)
	}
	for _, k := range settings.AgentKeys {
		if k.Flag == "" {
			continue
		}
		if _, _, err := parseRun([]string{"--" + k.Flag + "=" + k.DefaultText()}); err != nil {
			t.Errorf("--%s=%s: %v", k.Flag, k.DefaultText(), err)
		}
	}
}

// TestFlagsOverrideFile: a flag wins over the file, a file value stays
// when no flag names it, and existing flag names keep working.
func TestFlagsOverrideFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(p, []byte("pool:\n  mode: cache-eager\n  maxSlots: 16\nadmission:\n  overcommit: 2\n"), 0o600)
	cfg, _, err := parseRun([]string{"-config", p, "-mode", "uncached", "-overcommit", "1.5", "-budget", "2", "-max-quota", "4",
		"-prewarm", "250m=1", "-limit", "share", "-policy", "degrade"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := cfg.Settings()
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode != "uncached" || s.Overcommit != 1.5 || s.MaxSlots != 16 || s.BudgetMilli != 2000 || s.MaxQuotaMilli != 4000 ||
		s.Prewarm[250] != 1 || len(s.Prewarm) != 1 || s.Limit.String() != "share" || s.Policy != "degrade" {
		t.Fatalf("%+v", s)
	}
}

// quiet keeps the flag package's usage text out of the test log.
func quiet(t *testing.T) {
	stderr := os.Stderr
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	os.Stderr = null
	t.Cleanup(func() { os.Stderr = stderr; null.Close() })
}

// In Kubernetes mode the shared socket is off unless a flag or the file
// names one: each pod gets a socket of its own.
func TestKubernetesSocketOnlyWhenNamed(t *testing.T) {
	def := agent.DefaultConfig().Socket
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kubernetes"}, ""},
		{[]string{"--kubernetes", "--socket", def}, def},
		{[]string{"--kubernetes", "--socket=/s"}, "/s"},
		{[]string{"--socket=/s"}, "/s"},
		{nil, def},
	} {
		cfg, _, err := parseRun(c.args)
		if err != nil || cfg.Socket != c.want {
			t.Errorf("%q: socket %q (%v), want %q", c.args, cfg.Socket, err, c.want)
		}
	}
}
