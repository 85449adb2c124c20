package agent

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/pool"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// TestExampleConfig keeps the documented example loadable and equal to the
// defaults where it says so.
func TestExampleConfig(t *testing.T) {
	c, err := LoadConfig("../../docs/agent.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := c.Settings()
	if err != nil {
		t.Fatal(err)
	}
	d, _ := DefaultConfig().Settings()
	if pool.FormatPrewarm(pc.Prewarm) != pool.FormatPrewarm(d.Prewarm) || pc.Mode != d.Mode || pc.PeriodUS != d.PeriodUS || pc.MaxSlots != d.MaxSlots {
		t.Fatalf("example drifted from defaults: %+v vs %+v", pc, d)
	}
	if c.Limits != DefaultConfig().Limits {
		t.Fatalf("example limits drifted from defaults: %+v", c.Limits)
	}
	if c.Kubernetes.AnnotationCeilings != DefaultConfig().Kubernetes.AnnotationCeilings {
		t.Fatalf("example annotation ceilings drifted from defaults: %+v", c.Kubernetes.AnnotationCeilings)
	}
	if !reflect.DeepEqual(c.Kubernetes, DefaultConfig().Kubernetes) {
		t.Fatalf("example kubernetes section drifted from defaults: %+v", c.Kubernetes)
	}
	if ceil, err := c.Ceilings(); err != nil || ceil != settings.DefaultCeilings() {
		t.Fatalf("example annotation ceilings: %+v %v", ceil, err)
	}
	if c.ReapInterval.Duration != 10*time.Second || len(c.Standalone.ServeUnder) != 1 {
		t.Fatalf("%+v", c)
	}
	if c.APIVersion != ConfigAPIVersion || c.Kind != ConfigKind {
		t.Fatalf("example apiVersion %q kind %q, want %q %q", c.APIVersion, c.Kind, ConfigAPIVersion, ConfigKind)
	}
}

// TestConfigVersions: the versioned file and the older one without
// apiVersion and kind read alike; another version or kind, or one without
// the other, is refused with ErrConfigVersion.
func TestConfigVersions(t *testing.T) {
	dir := t.TempDir()
	load := func(body string) (Config, error) {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return LoadConfig(p)
	}
	const rest = "socket: /run/x.sock\npool:\n  prewarm: 250m=1\n"
	old, err := load(rest)
	if err != nil {
		t.Fatalf("the unversioned form: %v", err)
	}
	cur, err := load("apiVersion: " + ConfigAPIVersion + "\nkind: " + ConfigKind + "\n" + rest)
	if err != nil {
		t.Fatalf("the versioned form: %v", err)
	}
	if old.Socket != "/run/x.sock" || cur.Socket != old.Socket || cur.Pool.Prewarm != old.Pool.Prewarm {
		t.Fatalf("the two forms read differently: %+v vs %+v", old, cur)
	}
	for name, head := range map[string]string{
		"other version": "apiVersion: agent.cpuslot.dev/v9\nkind: " + ConfigKind + "\n",
		"other kind":    "apiVersion: " + ConfigAPIVersion + "\nkind: Pod\n",
		"version only":  "apiVersion: " + ConfigAPIVersion + "\n",
		"kind only":     "kind: " + ConfigKind + "\n",
	} {
		if _, err := load(head + rest); !errors.Is(err, ErrConfigVersion) {
			t.Errorf("%s: %v, want ErrConfigVersion", name, err)
		}
	}
}

func TestBadConfig(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"unknown field": "sockett: /x\n",
		"bad duration":  "pool:\n  period: fast\n",
		"bad mode":      "pool:\n  mode: turbo\n",
		"bad prewarm":   "pool:\n  prewarm: 250m\n",
		"bad quota":     "pool:\n  prewarm: -1=2\n",
		"bad policy":    "admission:\n  policy: drop\n",
		"bad budget":    "admission:\n  budget: lots\n",
		"too many":      "pool:\n  prewarm: 250m=100\n  maxSlots: 10\n",
		"bad period":    "pool:\n  period: 10s\n",
		"bad maxQuota":  "pool:\n  maxQuota: lots\n",
		"no actions":    "pool:\n  maxActions: 0\n",
		"no containers": "maxContainers: 0\n",
		"no conns":      "limits:\n  maxConnections: 0\n",
		"no timeout":    "limits:\n  helloTimeout: 0s\n",
		// the runtime drops a plugin slower than its 2 s request timeout
		"nri slower than the runtime": "kubernetes:\n  nri:\n    startTimeout: 2s\n",
		"nri no wait":                 "kubernetes:\n  nri:\n    startTimeout: 0s\n",
	} {
		p := filepath.Join(dir, "c.yaml")
		os.WriteFile(p, []byte(body), 0o644)
		c, err := LoadConfig(p)
		if err == nil {
			_, err = c.Settings()
		}
		if err == nil {
			err = c.checkLimits()
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// A bad value of an agent-wide section is refused as a typed error naming
// its key, as a pool setting's is.
func TestConfigBadLimit(t *testing.T) {
	for body, key := range map[string]string{
		"limits:\n  maxConnections: 0\n":       "limits.maxConnections",
		"limits:\n  helloTimeout: 0s\n":        "limits.helloTimeout",
		"limits:\n  hostNamespaceFDs: maybe\n": "limits.hostNamespaceFDs",
		"limits:\n  maxConnectionsPerCPU: 1\n": "limits.maxConnectionsPerCPU",
	} {
		p := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(p, []byte(body), 0o644)
		_, err := LoadConfig(p)
		var se *settings.Error
		if !errors.As(err, &se) || se.Key != key {
			t.Errorf("%q: got %v, want a settings.Error for %s", body, err, key)
		}
	}
	p := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(p, []byte("limits:\n  maxConnections: 7\n  frameTimeout: 3s\n  hostNamespaceFDs: true\n"), 0o644)
	c, err := LoadConfig(p)
	if err != nil || c.Limits.MaxConnections != 7 || c.Limits.FrameTimeout.Duration != 3*time.Second || !c.Limits.HostNamespaceFDs ||
		c.Limits.MaxConnectionsPerProcess != 64 {
		t.Fatalf("got %+v, %v", c.Limits, err)
	}
}

// checkLimits, the gate of a configuration built in code or by flags,
// refuses what the file would: every agent-wide key out of its range, as
// a settings.Error naming it.
func TestCheckLimitsEveryKey(t *testing.T) {
	for _, k := range settings.AgentKeys {
		bad := map[settings.Kind]string{settings.KindInt: "0", settings.KindDuration: "0s"}[k.Kind]
		if bad == "" || settings.Check(k.Name, bad) == nil {
			continue // no value out of range to try
		}
		c := DefaultConfig()
		putText(c.field(k.Name), bad)
		var se *settings.Error
		if err := c.checkLimits(); !errors.As(err, &se) || se.Key != k.Name {
			t.Errorf("%s=%s: got %v, want a settings.Error for it", k.Name, bad, err)
		}
	}
	if err := DefaultConfig().checkLimits(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
}

// The file's keys and sections of settings.FileKeys are exactly the
// settings' keys, each at its key's path: the file has no list of its own.
func TestConfigFieldsAreSettings(t *testing.T) {
	var c Config
	for _, k := range settings.FileKeys() {
		if c.field(k.Name) == nil {
			t.Errorf("%s: no field in the file", k.Name)
		}
	}
	var walk func(typ reflect.Type, prefix string)
	walk = func(typ reflect.Type, prefix string) {
		for i := range typ.NumField() {
			tag, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			name := prefix + tag
			if settings.IsSection(name) && typ.Field(i).Type.Kind() == reflect.Struct {
				walk(typ.Field(i).Type, name+".")
			} else if _, ok := settings.FileKey(name); !ok {
				t.Errorf("%s (%s): no setting", name, typ.Field(i).Name)
			}
		}
	}
	walk(reflect.TypeOf(c.settingsSections), "")
	// A field of the file's own with a setting's or a section's name would
	// hide it (encoding/json takes the shallower field).
	own := reflect.TypeOf(c)
	for i := range own.NumField() {
		tag, _, _ := strings.Cut(own.Field(i).Tag.Get("json"), ",")
		if _, key := settings.FileKey(tag); !own.Field(i).Anonymous && (key || slices.Contains(settings.Sections(), tag)) {
			t.Errorf("Config.%s is tagged %q, the name of a setting or a section of settings.FileKeys", own.Field(i).Name, tag)
		}
	}
	for _, key := range []string{"", "pool", "pool.", "apiVersion", "standalone.pids", "pool.turbo", "admission.prewarm", "pool.maxSlots.x", "kubernetes.nri"} {
		if f := c.field(key); f != nil {
			t.Errorf("field(%q) = %T, want none", key, f)
		}
	}
}

// A section's unknown key is refused as a typed error naming it.
func TestConfigUnknownPoolKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(p, []byte("pool:\n  turbo: 1\n"), 0o644)
	_, err := LoadConfig(p)
	var se *settings.Error
	if !errors.As(err, &se) || se.Key != "pool.turbo" || !errors.Is(err, settings.ErrUnknownKey) {
		t.Fatalf("got %v", err)
	}
}

// The kubernetes section is read through the settings' parser as the
// others are: a bad value, at any depth, is refused when the file is
// loaded, as a settings.Error naming its key.
func TestConfigKubernetesKeys(t *testing.T) {
	for body, key := range map[string]string{
		"kubernetes:\n  select: [openwhisk, openwhisk]\n":          "kubernetes.select",
		"kubernetes:\n  select: [openwhisk, turbo]\n":              "kubernetes.select",
		"kubernetes:\n  select: [\"openwhisk,knative\"]\n":         "kubernetes.select",
		"kubernetes:\n  select: {a: b}\n":                          "kubernetes.select",
		"kubernetes:\n  socketVolume: Not_A_Name\n":                "kubernetes.socketVolume",
		"kubernetes:\n  containerdSocket: run/containerd.sock\n":   "kubernetes.containerdSocket",
		"kubernetes:\n  annotationCeilings:\n    maxSlots: 5000\n": "kubernetes.annotationCeilings.maxSlots",
		"kubernetes:\n  annotationCeilings:\n    budget: lots\n":   "kubernetes.annotationCeilings.budget",
		"kubernetes:\n  nri:\n    turbo: true\n":                   "kubernetes.nri.turbo",
		"kubernetes:\n  nri:\n    startTimeout: 1m\n":              "kubernetes.nri.startTimeout",
	} {
		p := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(p, []byte(body), 0o644)
		_, err := LoadConfig(p)
		var se *settings.Error
		if !errors.As(err, &se) || se.Key != key {
			t.Errorf("%q: got %v, want a settings.Error for %s", body, err, key)
		}
	}
	p := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(p, []byte("kubernetes:\n  select: [knative]\n  nri:\n    enabled: false\n    startTimeout: 5s\n"), 0o644)
	c, err := LoadConfig(p)
	if err != nil || !slices.Equal(c.Kubernetes.Select, []string{"knative"}) || c.Kubernetes.NRI.Enabled ||
		c.Kubernetes.PodsDir != DefaultConfig().Kubernetes.PodsDir || c.checkLimits() != nil {
		t.Fatalf("got %+v, %v", c.Kubernetes, err)
	}
}
