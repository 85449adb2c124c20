// Code generated from internal/settings by `make settings-doc`. DO NOT EDIT.

package agent

// settingsSections are the file's keys of settings.FileKeys and their
// sections, in Config: a top-level key is read as its type reads (and
// checked with the configuration), a section through the settings' parser.
type settingsSections struct {
	// Unix socket runtimes connect to (mode 0666: access is decided per peer by SO_PEERCRED and the peer's cgroup, not by file mode)
	Socket string `json:"socket"`
	// address of /metrics, /healthz, /readyz, /debug/pools ("" = none)
	HTTP string `json:"http"`
	// serve /debug/pools (every container's name and budget) also to peers not on loopback; off, they get 403
	DebugPoolsRemote bool `json:"debugPoolsRemote"`
	// agent log level: debug, info, warn or error
	LogLevel string `json:"logLevel"`
	// how often idle slots and gone containers are checked
	ReapInterval Duration `json:"reapInterval"`
	// containers served at once per node; more are refused (NOT_READY to a client) and counted as containers_exhausted
	MaxContainers int              `json:"maxContainers"`
	Pool          PoolConfig       `json:"pool"`
	Admission     AdmissionConfig  `json:"admission"`
	Limits        LimitsConfig     `json:"limits"`
	Kubernetes    KubernetesConfig `json:"kubernetes"`
}

// PoolConfig is the file's pool section: one field per key of settings.FileKeys.
type PoolConfig struct {
	// slots kept ready per quota, e.g. 250m=8,500m=4,1=2 ("" = none)
	Prewarm string `json:"prewarm"`
	// pool mode: affinity, cache-lazy, cache-eager or uncached
	Mode string `json:"mode"`
	// how a slot limits CPU: cap, share or both
	Limit string `json:"limit"`
	// CFS period of every slot, 1ms..1s
	Period Duration `json:"period"`
	// slots per container, pre-warmed and grown
	MaxSlots int `json:"maxSlots"`
	// grown slots idle this long are removed
	IdleTimeout Duration `json:"idleTimeout"`
	// wait budget of a request that gives none
	DefaultWait Duration `json:"defaultWait"`
	// cap on any request's wait budget
	MaxWait Duration `json:"maxWait"`
	// largest quota a request may ask in a container without a CPU limit ("" = the node's CPUs)
	MaxQuota string `json:"maxQuota"`
	// distinct action names per container in metrics; later ones are counted as _other
	MaxActions int `json:"maxActions"`
}

func (s *PoolConfig) field(key string) any { return sectionField(s, "pool", key) }

// UnmarshalJSON reads the section through the settings' parser.
func (s *PoolConfig) UnmarshalJSON(b []byte) error { return decodeSection(b, "pool", s.field) }

// AdmissionConfig is the file's admission section: one field per key of settings.FileKeys.
type AdmissionConfig struct {
	// CPU budget per container ("" = the container's CPU limit, or unlimited when it has none)
	Budget string `json:"budget"`
	// budget multiplier, in (0, 100]
	Overcommit float64 `json:"overcommit"`
	// share of a sleeping lease's quota lent to new leases, in [0, 1] (0 = no lending)
	LendRatio float64 `json:"lendRatio"`
	// when a quota does not fit the budget: queue, degrade or reject
	Policy string `json:"policy"`
	// smallest quota a degraded grant gets
	MinDegraded string `json:"minDegraded"`
}

func (s *AdmissionConfig) field(key string) any { return sectionField(s, "admission", key) }

// UnmarshalJSON reads the section through the settings' parser.
func (s *AdmissionConfig) UnmarshalJSON(b []byte) error {
	return decodeSection(b, "admission", s.field)
}

// LimitsConfig is the file's limits section: one field per key of settings.FileKeys.
type LimitsConfig struct {
	// open connections on the node of peers in no served container; more are closed at accept
	MaxConnections int `json:"maxConnections"`
	// open connections of one served container's processes, its own share apart from maxConnections
	MaxConnectionsPerContainer int `json:"maxConnectionsPerContainer"`
	// connections without a completed HELLO of one user's processes in no served container
	MaxPendingHelloPerUID int `json:"maxPendingHelloPerUID"`
	// connections without a completed HELLO from one cgroup in no served container
	MaxPendingHelloPerCgroup int `json:"maxPendingHelloPerCgroup"`
	// open connections of one client process
	MaxConnectionsPerProcess int `json:"maxConnectionsPerProcess"`
	// new connections a second of one peer: on a container's own socket, and per user and per cgroup on the shared socket; past it the socket waits, or the connection is closed at accept
	AcceptRate int `json:"acceptRate"`
	// burst of new connections of one peer beyond acceptRate (a container's reconnect after an agent restart)
	AcceptBurst int `json:"acceptBurst"`
	// new connections a second on the shared socket, in bursts of maxConnections; past it the socket stops accepting for a while
	SharedAcceptRate int `json:"sharedAcceptRate"`
	// thread moves a second the agent makes for one container's processes (each ACQUIRE for which the agent places the thread; in cache-eager each RELEASE too), in bursts of as many; past it the container's connections wait their turn
	PlacementRate int `json:"placementRate"`
	// a new connection must complete HELLO within this
	HelloTimeout Duration `json:"helloTimeout"`
	// a frame, once begun, must arrive (and answers be read) within this
	FrameTimeout Duration `json:"frameTimeout"`
	// cgroup v1: also pass placement fds to runtimes in the agent's PID namespace (trusted standalone runtimes only: such a fd moves any process of the node)
	HostNamespaceFDs bool `json:"hostNamespaceFDs"`
}

func (s *LimitsConfig) field(key string) any { return sectionField(s, "limits", key) }

// UnmarshalJSON reads the section through the settings' parser.
func (s *LimitsConfig) UnmarshalJSON(b []byte) error { return decodeSection(b, "limits", s.field) }

// KubernetesConfig is the file's kubernetes section: one field per key of settings.FileKeys.
type KubernetesConfig struct {
	// only pods with this spec.nodeName are watched ("" = the NODE_NAME environment variable)
	NodeName string `json:"nodeName"`
	// containerd's API socket on the node (an absolute path; the chart mounts it at the same path)
	ContainerdSocket string `json:"containerdSocket"`
	// containerd namespace of the kubelet's containers
	ContainerdNamespace string `json:"containerdNamespace"`
	// the kubelet's pod directory, as the agent sees it (the chart mounts it at the same path, HostToContainer)
	PodsDir string `json:"podsDir"`
	// name of the emptyDir volume a served pod declares for its socket
	SocketVolume string `json:"socketVolume"`
	// which pods are served: openwhisk (label user-action-pod=true, container user-action), knative (label serving.knative.dev/revision, container user-container), annotated (cpuslot.dev/enabled: "true")
	Select []string `json:"select"`
	// kubeconfig, when running outside a pod ("" = the service account)
	Kubeconfig         string                   `json:"kubeconfig"`
	AnnotationCeilings AnnotationCeilingsConfig `json:"annotationCeilings"`
	NRI                NRIConfig                `json:"nri"`
}

func (s *KubernetesConfig) field(key string) any { return sectionField(s, "kubernetes", key) }

// UnmarshalJSON reads the section through the settings' parser.
func (s *KubernetesConfig) UnmarshalJSON(b []byte) error {
	return decodeSection(b, "kubernetes", s.field)
}

// AnnotationCeilingsConfig is the file's kubernetes.annotationCeilings section: one field per key of settings.FileKeys.
type AnnotationCeilingsConfig struct {
	// ceiling of a pod's pool.maxSlots (cpuslot.dev/max-slots); 0: none
	MaxSlots int `json:"maxSlots"`
	// ceiling of the slots of a pod's pool.prewarm, all quotas together; 0: none
	PrewarmSlots int `json:"prewarmSlots"`
	// ceiling of a pod's admission.overcommit; 0: none
	Overcommit float64 `json:"overcommit"`
	// ceiling of a pod's admission.lendRatio; 0: none
	LendRatio float64 `json:"lendRatio"`
	// ceiling of a pod's admission.budget ("" = the container's CPU limit)
	Budget string `json:"budget"`
}

func (s *AnnotationCeilingsConfig) field(key string) any {
	return sectionField(s, "kubernetes.annotationCeilings", key)
}

// UnmarshalJSON reads the section through the settings' parser.
func (s *AnnotationCeilingsConfig) UnmarshalJSON(b []byte) error {
	return decodeSection(b, "kubernetes.annotationCeilings", s.field)
}

// NRIConfig is the file's kubernetes.nri section: one field per key of settings.FileKeys.
type NRIConfig struct {
	// serve runtime pods at their container's start as an NRI plugin of the container runtime
	Enabled bool `json:"enabled"`
	// the runtime's NRI socket on the node (an absolute path; the chart mounts its directory)
	Socket string `json:"socket"`
	// how long StartContainer and UpdateContainer wait for the agent before the container goes on without (counted as nri_fail_open, logged); below the runtime's 2s request timeout
	StartTimeout Duration `json:"startTimeout"`
}

func (s *NRIConfig) field(key string) any { return sectionField(s, "kubernetes.nri", key) }

// UnmarshalJSON reads the section through the settings' parser.
func (s *NRIConfig) UnmarshalJSON(b []byte) error { return decodeSection(b, "kubernetes.nri", s.field) }
