package agent

import (
	"fmt"
	"os"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/pool"
	"github.com/cpuslot/cpuslot/internal/server"
)

// Config is the agent's configuration file (YAML). Every field has a
// default; flags override the file.
type Config struct {
	// Socket is the Unix socket runtimes connect to.
	Socket string `json:"socket"`
	// HTTP is the address of /metrics, /healthz, /readyz and /debug/pools.
	HTTP string `json:"http"`
	// LogLevel is debug, info, warn or error.
	LogLevel  string          `json:"logLevel"`
	Pool      PoolConfig      `json:"pool"`
	Admission AdmissionConfig `json:"admission"`
	// Standalone lists what to serve without Kubernetes.
	Standalone StandaloneConfig `json:"standalone"`
	// ReapInterval is how often idle slots and gone containers are checked.
	ReapInterval Duration `json:"reapInterval"`
	// MaxContainers bounds the containers served at once; more are refused
	// (NOT_READY to a client, an error to a source) and counted.
	MaxContainers int `json:"maxContainers"`
	// Kubernetes configures Kubernetes mode (docs/kubernetes-contract.md).
	Kubernetes KubernetesConfig `json:"kubernetes"`
	// Limits bound what peers can hold (docs/security.md).
	Limits LimitsConfig `json:"limits"`
}

// LimitsConfig bounds the resources peers can make the agent hold.
type LimitsConfig struct {
	// MaxConnections is the most open connections on the node.
	MaxConnections int `json:"maxConnections"`
	// MaxConnectionsPerProcess is the most open connections per peer process.
	MaxConnectionsPerProcess int `json:"maxConnectionsPerProcess"`
	// HelloTimeout is how long a new connection may take to complete HELLO.
	HelloTimeout Duration `json:"helloTimeout"`
	// FrameTimeout is how long the rest of a frame may take once its first
	// byte arrived.
	FrameTimeout Duration `json:"frameTimeout"`
	// HostNamespaceFDs passes placement fds on cgroup v1 also to runtimes
	// in the agent's PID namespace (standalone runtimes you trust: such a
	// runtime can move any process of the node into its slots).
	HostNamespaceFDs bool `json:"hostNamespaceFDs"`
}

// KubernetesConfig is the Kubernetes mode's setup.
type KubernetesConfig struct {
	// NodeName defaults to the NODE_NAME environment variable.
	NodeName            string   `json:"nodeName"`
	ContainerdSocket    string   `json:"containerdSocket"`
	ContainerdNamespace string   `json:"containerdNamespace"`
	PodsDir             string   `json:"podsDir"`
	SocketVolume        string   `json:"socketVolume"`
	Select              []string `json:"select"`
	// Kubeconfig is for running outside a pod; in a pod the service
	// account is used.
	Kubeconfig string `json:"kubeconfig"`
}

// PoolConfig is the per-container pool setup.
type PoolConfig struct {
	// Prewarm is e.g. "250m=8,500m=4,1=2": slots kept ready per quota.
	Prewarm     string   `json:"prewarm"`
	Mode        string   `json:"mode"`
	Limit       string   `json:"limit"`
	Period      Duration `json:"period"`
	MaxSlots    int      `json:"maxSlots"`
	IdleTimeout Duration `json:"idleTimeout"`
	DefaultWait Duration `json:"defaultWait"`
	MaxWait     Duration `json:"maxWait"`
	// MaxQuota bounds a request's quota in a container without a CPU
	// limit (one with a limit is bounded by it); empty: the node's CPUs.
	MaxQuota string `json:"maxQuota"`
	// MaxActions bounds the distinct action names per container in
	// metrics; later ones are counted as "_other".
	MaxActions int `json:"maxActions"`
}

// AdmissionConfig bounds the CPU granted per container.
type AdmissionConfig struct {
	// Budget is a CPU quantity ("2", "1500m"); empty means the container's
	// CPU limit, or unlimited when it has none.
	Budget      string  `json:"budget"`
	Overcommit  float64 `json:"overcommit"`
	Policy      string  `json:"policy"`
	MinDegraded string  `json:"minDegraded"`
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

// DefaultMaxContainers holds 250 pods with room to spare.
const DefaultMaxContainers = 512

// DefaultConfig is the agent's configuration when nothing is given.
func DefaultConfig() Config {
	p := pool.DefaultConfig()
	return Config{
		Socket:   "/run/cpuslot/agent.sock",
		HTTP:     "127.0.0.1:9464",
		LogLevel: "info",
		Pool: PoolConfig{
			Prewarm: pool.FormatPrewarm(p.Prewarm), Mode: p.Mode.String(), Limit: p.Limit.String(),
			Period: Duration{100 * time.Millisecond}, MaxSlots: p.MaxSlots, IdleTimeout: Duration{p.IdleTimeout},
			DefaultWait: Duration{p.DefaultWait}, MaxWait: Duration{p.MaxWait}, MaxActions: p.MaxActions,
		},
		MaxContainers: DefaultMaxContainers,
		Admission:     AdmissionConfig{Overcommit: 1, Policy: "queue", MinDegraded: "50m"},
		Limits: LimitsConfig{MaxConnections: 4096, MaxConnectionsPerProcess: 64,
			HelloTimeout: Duration{10 * time.Second}, FrameTimeout: Duration{10 * time.Second}},
		ReapInterval: Duration{10 * time.Second},
		Kubernetes: KubernetesConfig{
			ContainerdSocket:    "/run/containerd/containerd.sock",
			ContainerdNamespace: "k8s.io",
			PodsDir:             "/var/lib/kubelet/pods",
			SocketVolume:        "cpuslot",
			Select:              []string{"openwhisk", "knative", "annotated"},
		},
	}
}

// LoadConfig reads a YAML file over the defaults; unknown fields are errors.
func LoadConfig(path string) (Config, error) {
	c := DefaultConfig()
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ServerLimits are the connection limits for the server.
func (c Config) ServerLimits() server.Limits {
	return server.Limits{MaxConns: c.Limits.MaxConnections, MaxConnsPerProcess: c.Limits.MaxConnectionsPerProcess,
		HelloTimeout: c.Limits.HelloTimeout.Duration, FrameTimeout: c.Limits.FrameTimeout.Duration,
		HostNamespaceFDs: c.Limits.HostNamespaceFDs}
}

// checkLimits rejects limits that would refuse every client or never time out.
func (c Config) checkLimits() error {
	l := c.Limits
	switch {
	case l.MaxConnections < 1:
		return fmt.Errorf("limits.maxConnections %d: must be at least 1", l.MaxConnections)
	case l.MaxConnectionsPerProcess < 1:
		return fmt.Errorf("limits.maxConnectionsPerProcess %d: must be at least 1", l.MaxConnectionsPerProcess)
	case l.HelloTimeout.Duration <= 0:
		return fmt.Errorf("limits.helloTimeout %v: must be positive", l.HelloTimeout)
	case l.FrameTimeout.Duration <= 0:
		return fmt.Errorf("limits.frameTimeout %v: must be positive", l.FrameTimeout)
	}
	return nil
}

// PoolSettings turns the file's pool and admission sections into a
// pool.Config, with clear errors for bad values.
func (c Config) PoolSettings() (pool.Config, error) {
	pc := pool.DefaultConfig()
	var err error
	if pc.Prewarm, err = pool.ParsePrewarm(c.Pool.Prewarm); err != nil {
		return pc, fmt.Errorf("pool.prewarm: %w", err)
	}
	if pc.Mode, err = pool.ParseMode(c.Pool.Mode); err != nil {
		return pc, fmt.Errorf("pool.mode: %w", err)
	}
	if pc.Limit, err = cgroup.ParseLimit(c.Pool.Limit); err != nil {
		return pc, fmt.Errorf("pool.limit: %w", err)
	}
	period := c.Pool.Period.Microseconds()
	if period < 1000 || period > 1_000_000 {
		return pc, fmt.Errorf("pool.period %v: must be within 1ms..1s", c.Pool.Period)
	}
	pc.PeriodUS = uint32(period)
	pc.MaxSlots = c.Pool.MaxSlots
	pc.IdleTimeout = c.Pool.IdleTimeout.Duration
	pc.DefaultWait = c.Pool.DefaultWait.Duration
	pc.MaxWait = c.Pool.MaxWait.Duration
	pc.MaxActions = c.Pool.MaxActions
	if c.MaxContainers < 1 {
		// Not a pool setting, but checked with them: this is where a
		// configuration is validated.
		return pc, fmt.Errorf("maxContainers %d: must be at least 1", c.MaxContainers)
	}
	if c.Pool.MaxQuota != "" {
		if pc.MaxQuotaMilli, err = pool.ParseQuota(c.Pool.MaxQuota); err != nil {
			return pc, fmt.Errorf("pool.maxQuota: %w", err)
		}
	}
	if c.Admission.Budget != "" {
		if pc.BudgetMilli, err = pool.ParseQuota(c.Admission.Budget); err != nil {
			return pc, fmt.Errorf("admission.budget: %w", err)
		}
	}
	pc.Overcommit = c.Admission.Overcommit
	if pc.Policy, err = admission.ParsePolicy(c.Admission.Policy); err != nil {
		return pc, fmt.Errorf("admission.policy: %w", err)
	}
	if c.Admission.MinDegraded != "" {
		if pc.MinDegradedMilli, err = pool.ParseQuota(c.Admission.MinDegraded); err != nil {
			return pc, fmt.Errorf("admission.minDegraded: %w", err)
		}
	}
	return pc, pc.Validate()
}
