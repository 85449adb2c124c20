package settings

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// AgentKeys are the agent-wide settings of the file (one value per agent,
// not per container, so no Pool holds them): the generated files list them
// with Keys, in sections of their own; the agent keeps their values in its
// Config. A key with a Flag is a flag of the agent's run, checked as the
// file's value is.
var AgentKeys = []Key{
	{Name: "socket", Flag: "socket", Kind: KindString, Default: "/run/cpuslot/agent.sock", NoChart: true,
		ChartDoc: "(none: in Kubernetes each pod gets a socket of its own)",
		Doc:      "Unix socket runtimes connect to (mode 0666: access is decided per peer by SO_PEERCRED and the peer's cgroup, not by file mode)",
		Meaning:  "where runtimes connect"},
	{Name: "http", Flag: "http", Kind: KindString, Default: "127.0.0.1:9464",
		ChartFrom: `printf "0.0.0.0:%d" (int .Values.metrics.port) | quote`, ChartDoc: "`metrics.port` (the chart listens on `0.0.0.0:<port>`)",
		Doc:     `address of /metrics, /healthz, /readyz, /debug/pools ("" = none)`,
		Meaning: "`/metrics`, `/healthz`, `/readyz`, `/debug/pools`; `\"\"` disables"},
	{Name: "debugPoolsRemote", Flag: "debug-pools-remote", Kind: KindBool, Default: "false",
		ChartFrom: ".Values.metrics.debugPoolsRemote", ChartDoc: "`metrics.debugPoolsRemote`",
		Doc:     "serve /debug/pools (every container's name and budget) also to peers not on loopback; off, they get 403",
		Meaning: "serve `/debug/pools` (every container's name and budget) also to peers not on loopback; off, they get 403"},
	{Name: "logLevel", Flag: "log-level", Kind: KindChoice, Choices: []string{"debug", "info", "warn", "error"}, Default: "info",
		Doc: "agent log level: debug, info, warn or error"},
	{Name: "reapInterval", Kind: KindDuration, Min: minDuration, Max: noMax, Default: "10s",
		Doc: "how often idle slots and gone containers are checked"},
	{Name: "maxContainers", Flag: "max-containers", Kind: KindInt, Min: 1, Max: noMax, Default: "512",
		Doc:     "containers served at once per node; more are refused (NOT_READY to a client) and counted as containers_exhausted",
		Meaning: "containers served at once; more are refused (`NOT_READY`) and counted (`containers_exhausted`); the pool-side limits: [`security.md`](security.md#pool-side-limits)"},
	{Name: "limits.maxConnections", Flag: "max-connections", Kind: KindInt, Min: 1, Max: noMax, Default: "4096",
		Doc:     "open connections on the node of peers in no served container; more are closed at accept",
		Meaning: "open connections on the node of peers in no served container, until a HELLO names their container; when full, a newcomer displaces a waiting connection of the cgroup that holds the most ([`security.md`](security.md#limits))"},
	{Name: "limits.maxConnectionsPerContainer", Kind: KindInt, Min: 1, Max: noMax, Default: "1024",
		Doc:     "open connections of one served container's processes, its own share apart from maxConnections",
		Meaning: "open connections of one served container's processes: its own share, apart from `maxConnections`"},
	{Name: "limits.maxPendingHelloPerUID", Kind: KindInt, Min: 1, Max: noMax, Default: "256",
		Doc: "connections without a completed HELLO of one user's processes in no served container"},
	{Name: "limits.maxPendingHelloPerCgroup", Kind: KindInt, Min: 1, Max: noMax, Default: "256",
		Doc: "connections without a completed HELLO from one cgroup in no served container"},
	{Name: "limits.maxConnectionsPerProcess", Flag: "max-connections-per-process", Kind: KindInt, Min: 1, Max: noMax, Default: "64",
		Doc: "open connections of one client process"},
	{Name: "limits.acceptRate", Kind: KindInt, Min: 1, Max: noMax, Default: "100",
		Doc:     "new connections a second of one peer: on a container's own socket, and per user and per cgroup on the shared socket; past it the socket waits, or the connection is closed at accept",
		Meaning: "new connections a second of one peer: a container's own socket stops accepting for a while, the shared socket closes a connection at accept whose user (before its cgroup is read; root has none) or cgroup is past it ([`security.md`](security.md#limits))"},
	{Name: "limits.acceptBurst", Kind: KindInt, Min: 1, Max: noMax, Default: "1024",
		Doc: "burst of new connections of one peer beyond acceptRate (a container's reconnect after an agent restart)"},
	{Name: "limits.sharedAcceptRate", Kind: KindInt, Min: 1, Max: noMax, Default: "250",
		Doc: "new connections a second on the shared socket, in bursts of maxConnections; past it the socket stops accepting for a while"},
	{Name: "limits.placementRate", Kind: KindInt, Min: 1, Max: noMax, Default: "1000",
		Doc:     "thread moves a second the agent makes for one container's processes (each ACQUIRE for which the agent places the thread; in cache-eager each RELEASE too), in bursts of as many; past it the container's connections wait their turn",
		Meaning: "thread moves a second the agent makes for one container, over all its processes (each ACQUIRE for which the agent places the thread: one an invocation; in `cache-eager` its RELEASE too), in bursts of as many; past it that container's connections are not read until their turn ([`security.md`](security.md#limits)); a runtime that places its own threads (LOCAL) takes none"},
	{Name: "limits.helloTimeout", Kind: KindDuration, Min: minDuration, Max: noMax, Default: "10s",
		Doc: "a new connection must complete HELLO within this"},
	{Name: "limits.frameTimeout", Kind: KindDuration, Min: minDuration, Max: noMax, Default: "10s",
		Doc: "a frame, once begun, must arrive (and answers be read) within this"},
	{Name: "limits.hostNamespaceFDs", Flag: "host-namespace-fds", Kind: KindBool, Default: "false", NoChart: true,
		Doc:     "cgroup v1: also pass placement fds to runtimes in the agent's PID namespace (trusted standalone runtimes only: such a fd moves any process of the node)",
		Meaning: "cgroup v1: pass placement fds also to runtimes in the agent's PID namespace (trusted standalone runtimes only: such a fd moves any process of the node; [`security.md`](security.md))"},
	{Name: "kubernetes.nodeName", Flag: "node-name", Kind: KindString, NoChart: true, ChartDoc: "(env `NODE_NAME`)", EmptyMeans: "env `NODE_NAME`",
		Doc:     `only pods with this spec.nodeName are watched ("" = the NODE_NAME environment variable)`,
		Meaning: "only pods with `spec.nodeName` = this are watched"},
	{Name: "kubernetes.containerdSocket", Flag: "containerd-socket", Kind: KindString, Pattern: `^/.+[^/]$`, Default: "/run/containerd/containerd.sock",
		Doc: "containerd's API socket on the node (an absolute path; the chart mounts it at the same path)"},
	{Name: "kubernetes.containerdNamespace", Kind: KindString, Min: 1, Default: "k8s.io",
		Doc: "containerd namespace of the kubelet's containers"},
	{Name: "kubernetes.podsDir", Flag: "kubelet-pods-dir", Kind: KindString, Pattern: `^/.*$`, Default: "/var/lib/kubelet/pods",
		Doc: "the kubelet's pod directory, as the agent sees it (the chart mounts it at the same path, HostToContainer)"},
	{Name: "kubernetes.socketVolume", Kind: KindString, Pattern: `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, Max: 63, Default: "cpuslot",
		Doc: "name of the emptyDir volume a served pod declares for its socket"},
	{Name: "kubernetes.select", Kind: KindList, Choices: Selections, Default: "openwhisk,knative,annotated",
		Doc:     "which pods are served: openwhisk (label user-action-pod=true, container user-action), knative (label serving.knative.dev/revision, container user-container), annotated (cpuslot.dev/enabled: \"true\")",
		Meaning: "which pods are served ([`kubernetes-contract.md`](kubernetes-contract.md#which-pods-are-served))"},
	{Name: "kubernetes.kubeconfig", Flag: "kubeconfig", Kind: KindString, NoChart: true, EmptyMeans: "the service account",
		Doc:     `kubeconfig, when running outside a pod ("" = the service account)`,
		Meaning: "for running outside a pod"},
	{Name: "kubernetes.annotationCeilings.maxSlots", Kind: KindInt, Min: 0, Max: 4096, Default: strconv.Itoa(DefaultCeilings().MaxSlots),
		Doc:     "ceiling of a pod's pool.maxSlots (cpuslot.dev/max-slots); 0: none",
		Meaning: "a pod's `cpuslot.dev/max-slots` above it is clamped to it, with a `CpuslotAnnotationClamped` Event on the pod; 0: no ceiling ([`kubernetes-contract.md`](kubernetes-contract.md#which-pods-are-served))"},
	{Name: "kubernetes.annotationCeilings.prewarmSlots", Kind: KindInt, Min: 0, Max: 4096, Default: strconv.Itoa(DefaultCeilings().PrewarmSlots),
		Doc:     "ceiling of the slots of a pod's pool.prewarm, all quotas together; 0: none",
		Meaning: "the slots of a pod's `cpuslot.dev/prewarm`, all quotas together, above it are cut to it (the smallest quotas kept first); 0: no ceiling"},
	{Name: "kubernetes.annotationCeilings.overcommit", Kind: KindFraction, Min: 0, Max: 100, Default: strconv.FormatFloat(DefaultCeilings().Overcommit, 'g', -1, 64),
		Doc:     "ceiling of a pod's admission.overcommit; 0: none",
		Meaning: "ceiling of a pod's `cpuslot.dev/overcommit`; 0: no ceiling"},
	{Name: "kubernetes.annotationCeilings.lendRatio", Kind: KindFraction, Min: 0, Max: 1, Default: strconv.FormatFloat(DefaultCeilings().LendRatio, 'g', -1, 64),
		Doc:     "ceiling of a pod's admission.lendRatio; 0: none",
		Meaning: "ceiling of a pod's `cpuslot.dev/lend-ratio`; 0: no ceiling"},
	{Name: "kubernetes.annotationCeilings.budget", Kind: KindQuantity, Optional: true, EmptyMeans: "the container's CPU limit",
		Doc:     `ceiling of a pod's admission.budget ("" = the container's CPU limit)`,
		Meaning: "ceiling of a pod's `cpuslot.dev/budget` (a CPU quantity); `\"\"`: the container's CPU limit as its spec asks, none when it has none"},
	{Name: "kubernetes.nri.enabled", Chart: "nri.enabled", Kind: KindBool, Default: "true",
		Doc:     "serve runtime pods at their container's start as an NRI plugin of the container runtime",
		Meaning: "serve runtime pods as an NRI plugin of the container runtime (containerd 2, CRI-O): slots and the pod's socket are made at the container's `StartContainer`, before its first instruction; the pod watch stays as the fallback ([`architecture.md`](architecture.md#nri))"},
	{Name: "kubernetes.nri.socket", Chart: "nri.socket", Kind: KindString, Pattern: "^/", Default: "/var/run/nri/nri.sock",
		Doc: "the runtime's NRI socket on the node (an absolute path; the chart mounts its directory)"},
	{Name: "kubernetes.nri.startTimeout", Chart: "nri.startTimeout", Kind: KindDuration, Min: 0, Max: noMax, Default: "1s",
		Pattern: `^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s))+$`, Rule: nriStartTimeout,
		Doc:     "how long StartContainer and UpdateContainer wait for the agent before the container goes on without (counted as nri_fail_open, logged); below the runtime's 2s request timeout",
		Meaning: "how long `StartContainer` and `UpdateContainer` wait for the agent; a container not served by then starts without (counted as `nri_fail_open`, logged) and is served in the background. Above 0, below the runtime's 2 s request timeout"},
}

// Selections are the kinds of pod kubernetes.select chooses among.
var Selections = []string{"openwhisk", "knative", "annotated"}

// nriStartTimeout is kubernetes.nri.startTimeout's Rule: the runtime
// disconnects a plugin slower than its 2 s request timeout, and a plugin
// that waits not at all serves nothing at the start.
func nriStartTimeout(get func(string) string) error {
	if get("kubernetes.nri.enabled") != "true" {
		return nil
	}
	if d, err := time.ParseDuration(get("kubernetes.nri.startTimeout")); err != nil || d <= 0 || d >= 2*time.Second {
		return fmt.Errorf("%w: must be above 0 and below the runtime's 2s request timeout", ErrRange)
	}
	return nil
}

// minDuration is the Min of a duration that must be positive (seconds).
const minDuration = 1e-9

// sectionDocs are the comments above an agent-wide section in the YAML
// files.
var sectionDocs = map[string]string{
	"pool":                          "Per-container pools. Pods override these with cpuslot.dev/* annotations (docs/kubernetes-contract.md).",
	"limits":                        "What peers can make the agent hold (docs/security.md). The defaults hold 250 pods with the runtimes' default connection pools.",
	"kubernetes":                    "Kubernetes mode (--kubernetes): which pods of the node are served, and how the agent reaches them (docs/kubernetes-contract.md).",
	"kubernetes.annotationCeilings": "The operator's bounds on what pods' cpuslot.dev/* annotations set: where tenants write pod annotations (a Knative Service's template) they must not raise these. A value above its ceiling is clamped to it, with a CpuslotAnnotationClamped Event on the pod. 0: no ceiling.",
	"kubernetes.nri":                "The agent as an NRI plugin of the container runtime (containerd 2 and CRI-O enable NRI by default): a runtime pod's slots and socket are made at its container's StartContainer, before its first instruction runs. The pod watch stays, for Events and as the fallback (NRI off in the runtime, a container started while the agent was away).",
}

// FileKeys are every setting of the agent's file: Keys, then AgentKeys.
func FileKeys() []Key { return append(slices.Clip(Keys), AgentKeys...) }

// FileKey finds a setting of the agent's file by its name.
func FileKey(name string) (Key, bool) {
	keys := FileKeys()
	i := slices.IndexFunc(keys, func(k Key) bool { return k.Name == name })
	if i < 0 {
		return Key{}, false
	}
	return keys[i], true
}

// DefaultText is the key's default in Set's syntax.
func (k Key) DefaultText() string {
	if k.get == nil {
		return k.Default
	}
	return k.get(Default())
}

// Check reports whether value is accepted for a setting of the file, as
// Set would (for a pool or admission key) or as its kind and range allow
// (an agent-wide key): an *Error naming the key, or nil.
func Check(key, value string) error {
	if _, ok := Lookup(key); ok {
		p := Default()
		return p.Set(key, value)
	}
	k, ok := FileKey(key)
	if !ok {
		return &Error{Key: key, Value: value, Err: ErrUnknownKey}
	}
	if err := k.check(value); err != nil {
		return &Error{Key: key, Value: value, Err: err}
	}
	return nil
}

// CheckRules runs the keys' Rules on a whole configuration (get reads a
// key's value in Set's syntax): an *Error naming the key, or nil.
func CheckRules(get func(key string) string) error {
	for _, k := range FileKeys() {
		if k.Rule == nil {
			continue
		}
		if err := k.Rule(get); err != nil {
			return &Error{Key: k.Name, Value: get(k.Name), Err: err}
		}
	}
	return nil
}

// IsSection says whether name is a section of the file (a mapping of
// keys, at any depth: "kubernetes", "kubernetes.nri").
func IsSection(name string) bool {
	return slices.ContainsFunc(FileKeys(), func(k Key) bool { return strings.HasPrefix(k.Name, name+".") })
}
