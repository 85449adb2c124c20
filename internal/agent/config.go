package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/cpuslot/cpuslot/internal/server"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// Config is the agent's configuration file (YAML). Every field has a
// default; flags override the file.
type Config struct {
	// APIVersion and Kind name the file's format: ConfigAPIVersion and
	// ConfigKind, or both empty for the older unversioned form, read alike.
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
	// The keys of settings.FileKeys and their sections: socket, http,
	// pool, admission, limits, kubernetes ... (config_settings.go).
	settingsSections
	// Standalone lists what to serve without Kubernetes.
	Standalone StandaloneConfig `json:"standalone"`
}

// Ceilings reads the annotation ceilings.
func (c Config) Ceilings() (settings.Ceilings, error) {
	cc := c.Kubernetes.AnnotationCeilings
	out := settings.Ceilings{MaxSlots: cc.MaxSlots, PrewarmSlots: cc.PrewarmSlots, Overcommit: cc.Overcommit, LendRatio: cc.LendRatio}
	switch {
	case cc.MaxSlots < 0, cc.PrewarmSlots < 0, !(cc.Overcommit >= 0), !(cc.LendRatio >= 0 && cc.LendRatio <= 1):
		return out, fmt.Errorf("kubernetes.annotationCeilings %+v: counts and overcommit must not be negative, lendRatio in [0, 1]", cc)
	}
	if cc.Budget != "" {
		b, err := settings.ParseQuota(cc.Budget)
		if err != nil {
			return out, fmt.Errorf("kubernetes.annotationCeilings.budget: %w", err)
		}
		out.BudgetMilli = b
	}
	return out, nil
}

// StandaloneConfig names the containers to serve without Kubernetes.
type StandaloneConfig struct {
	// Containers are cgroups (paths within the cpu hierarchy) to serve.
	Containers []string `json:"containers"`
	// PIDs are processes whose cgroups to serve.
	PIDs []int `json:"pids"`
	// ServeUnder are parent cgroups: a process connecting from any cgroup
	// below one is served in its own cgroup, prepared on first contact.
	ServeUnder []string `json:"serveUnder"`
	// SocketDir, when set, gives each served container a socket of its
	// own: <socketDir>/<its cgroup path, escaped>/agent.sock, in a
	// directory the operator makes and gives the container (sockets.go).
	SocketDir string `json:"socketDir"`
}

// Duration reads "100ms"-style strings in YAML.
type Duration struct{ time.Duration }

// UnmarshalJSON parses a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' {
		s = s[1 : len(s)-1]
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %s: %w", b, err)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }

// DefaultConfig is the agent's configuration when nothing is given.
func DefaultConfig() Config {
	var c Config
	for _, k := range settings.FileKeys() {
		putText(c.field(k.Name), k.DefaultText())
	}
	return c
}

// The format of the agent's file. A later version gets a new apiVersion
// here, and LoadConfig converts the ones it still reads.
const (
	ConfigAPIVersion = "agent.cpuslot.dev/v1alpha1"
	ConfigKind       = "AgentConfig"
)

// ErrConfigVersion: the file names another apiVersion or kind than this
// agent reads.
var ErrConfigVersion = errors.New("unsupported apiVersion or kind")

// LoadConfig reads a YAML file over the defaults; unknown fields are errors.
// It reads the versioned form (apiVersion, kind) and the older one without
// either, which has the same fields.
func LoadConfig(path string) (Config, error) {
	c := DefaultConfig()
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	if (c.APIVersion != "" || c.Kind != "") && (c.APIVersion != ConfigAPIVersion || c.Kind != ConfigKind) {
		return c, fmt.Errorf("%s: apiVersion %q, kind %q: %w (this agent reads apiVersion %s, kind %s, or a file with neither)",
			path, c.APIVersion, c.Kind, ErrConfigVersion, ConfigAPIVersion, ConfigKind)
	}
	return c, nil
}

// ServerLimits are the connection limits for the server.
func (c Config) ServerLimits() server.Limits {
	return server.Limits{MaxConns: c.Limits.MaxConnections, MaxConnsPerContainer: c.Limits.MaxConnectionsPerContainer,
		MaxPendingPerUID: c.Limits.MaxPendingHelloPerUID, MaxPendingPerCgroup: c.Limits.MaxPendingHelloPerCgroup,
		MaxConnsPerProcess: c.Limits.MaxConnectionsPerProcess,
		AcceptRate:         c.Limits.AcceptRate, AcceptBurst: c.Limits.AcceptBurst, SharedAcceptRate: c.Limits.SharedAcceptRate,
		HelloTimeout: c.Limits.HelloTimeout.Duration, FrameTimeout: c.Limits.FrameTimeout.Duration,
		PlacementRate:    c.Limits.PlacementRate,
		HostNamespaceFDs: c.Limits.HostNamespaceFDs}
}

// checkLimits rejects agent-wide values out of range (limits that would
// refuse every client or never time out) and settings that do not go
// together, by the keys' own checks and Rules: a configuration built by
// flags or in code is held to what the file is.
func (c Config) checkLimits() error {
	get := func(key string) string { return getText(c.field(key)) }
	for _, k := range settings.AgentKeys {
		if err := settings.Check(k.Name, get(k.Name)); err != nil {
			return err
		}
	}
	return settings.CheckRules(get)
}

// Settings reads the file's pool and admission sections (and any flags
// applied with Set) into the settings every container starts from.
func (c Config) Settings() (settings.Pool, error) {
	s := settings.Default()
	for _, k := range settings.Keys {
		if err := s.Set(k.Name, getText(c.field(k.Name))); err != nil {
			return s, err
		}
	}
	if c.MaxContainers < 1 {
		// Not a pool setting, but checked with them: this is where a
		// configuration is validated.
		return s, fmt.Errorf("maxContainers %d: must be at least 1", c.MaxContainers)
	}
	return s, s.Validate()
}

// Set sets a setting of the file by its key (settings.FileKeys), as a flag
// does: the value is checked as the file's would be.
func (c *Config) Set(key, value string) error {
	if err := settings.Check(key, value); err != nil {
		return err
	}
	putText(c.field(key), value)
	return nil
}

// field is the file's field holding a setting: the one at the key's YAML
// path ("pool.maxSlots" is Pool's field tagged maxSlots); nil when there
// is none.
func (c *Config) field(key string) any {
	if _, ok := settings.FileKey(key); !ok {
		return nil
	}
	return fieldAt(reflect.ValueOf(&c.settingsSections).Elem(), key)
}

// sectionField is the field of a section's struct (s, a pointer) holding
// a setting; nil when the key is of another section or none.
func sectionField(s any, section, key string) any {
	name, ok := strings.CutPrefix(key, section+".")
	if !ok {
		return nil
	}
	return fieldAt(reflect.ValueOf(s).Elem(), name)
}

// fieldAt follows a dotted path of json tags from a struct to a field and
// returns a pointer to it, or nil.
func fieldAt(v reflect.Value, path string) any {
	for name := range strings.SplitSeq(path, ".") {
		if v.Kind() != reflect.Struct || name == "" {
			return nil
		}
		next := reflect.Value{}
		for i := range v.NumField() {
			if tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ","); tag == name {
				next = v.Field(i)
			}
		}
		if !next.IsValid() {
			return nil
		}
		v = next
	}
	return v.Addr().Interface()
}

// decodeSection sets each key of a YAML section (as JSON) through the
// settings' parser; an unknown key is an error, as for the rest of the file.
func decodeSection(b []byte, section string, field func(string) any) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("%s: want a mapping: %w", section, err)
	}
	names := slices.Sorted(maps.Keys(raw))
	for _, name := range names {
		key := section + "." + name
		f := field(key)
		if f == nil {
			return &settings.Error{Key: key, Err: settings.ErrUnknownKey}
		}
		v := bytes.TrimSpace(raw[name])
		if string(v) == "null" {
			continue
		}
		if settings.IsSection(key) {
			if err := json.Unmarshal(v, f); err != nil {
				return err
			}
			continue
		}
		text := string(v)
		k, _ := settings.FileKey(key)
		if len(v) > 0 && v[0] == '"' {
			if err := json.Unmarshal(v, &text); err != nil {
				return &settings.Error{Key: key, Value: string(v), Err: settings.ErrSyntax}
			}
		} else if len(v) > 0 && v[0] == '[' && k.Kind == settings.KindList {
			var items []string
			if err := json.Unmarshal(v, &items); err != nil || slices.ContainsFunc(items, func(s string) bool { return strings.Contains(s, ",") }) {
				return &settings.Error{Key: key, Value: string(v), Err: fmt.Errorf("%w: want a list of names", settings.ErrSyntax)}
			}
			text = strings.Join(items, ",")
		} else if len(v) == 0 || v[0] == '{' || v[0] == '[' {
			return &settings.Error{Key: key, Value: string(v), Err: fmt.Errorf("%w: want a single value", settings.ErrSyntax)}
		}
		if err := settings.Check(key, text); err != nil {
			return err
		}
		putText(f, text)
	}
	return nil
}

// getText writes a field of the file in the settings' syntax.
func getText(f any) string {
	switch f := f.(type) {
	case *string:
		return *f
	case *int:
		return strconv.Itoa(*f)
	case *float64:
		return strconv.FormatFloat(*f, 'g', -1, 64)
	case *Duration:
		return f.Duration.String()
	case *bool:
		return strconv.FormatBool(*f)
	case *[]string:
		return strings.Join(*f, ",")
	}
	panic(fmt.Sprintf("agent: no text form for %T", f))
}

// putText stores a value the settings accepted into a field of the file.
func putText(f any, v string) {
	switch f := f.(type) {
	case *string:
		*f = v
	case *int:
		*f, _ = strconv.Atoi(v)
	case *float64:
		*f, _ = strconv.ParseFloat(v, 64)
	case *Duration:
		f.Duration, _ = time.ParseDuration(v)
	case *bool:
		*f = v == "true"
	case *[]string:
		*f = strings.Split(v, ",")
		if v == "" {
			*f = []string{}
		}
	default:
		panic(fmt.Sprintf("agent: cannot store %T", f))
	}
}
