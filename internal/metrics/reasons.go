package metrics

// The label values the agent counts, typed so that no call site invents
// one: every value listed here is exported from the start (metrics.New),
// so rates and alerts see a zero rather than nothing.

// Reason is why an error was counted (cpuslot_errors_total{reason}).
type Reason string

// Wire: what a peer sent or did.
const (
	BadRequest        Reason = "bad_request"         // a request the agent refuses (invalid field, foreign thread)
	BadFrame          Reason = "bad_frame"           // a frame that does not decode or exceeds its bounds
	NoHello           Reason = "no_hello"            // a first request that is not HELLO
	NotServed         Reason = "not_served"          // a peer in no container the agent serves
	UnknownLease      Reason = "unknown_lease"       // a lease that is not the peer's
	ConnectionLimit   Reason = "connection_limit"    // a connection over the per-node or per-process cap
	FDsRevoked        Reason = "fds_revoked"         // v1: a fd connection closed when its container gained a process outside the peer's PID namespace, or its slot fds were found passed on
	AcceptFailed      Reason = "accept_failed"       // accept failed (e.g. out of fds); the agent backs off
	SocketFailed      Reason = "socket_failed"       // a pod's socket could not be made (e.g. a planted file)
	UsageThrottled    Reason = "usage_throttled"     // a USAGE report waited: its process sent them faster than the agent credits them
	UsageOverclaimed  Reason = "usage_overclaimed"   // a USAGE report claimed more CPU than the process's held slots used: cut to that
	HoldListThrottled Reason = "hold_list_throttled" // a HOLD_LIST request refused: its process asked more often than the agent answers
	SleepThrottled    Reason = "sleep_throttled"     // a SLEEP refused: its container sent them faster than the agent lends (the lease stays awake)
	FramePaced        Reason = "frame_paced"         // a connection waited before its next frame: its container sent frames that changed nothing (refused requests, one-way frames that ended nothing), SLEEPs and WAKEs faster than PacedRate
	PlacementPaced    Reason = "placement_paced"     // a connection waited before its next frame: its container had the agent move its threads faster than limits.placementRate
	// Accepts (server/pace.go): reconnect churn.
	AcceptPaced       Reason = "accept_paced"        // an accept loop waited: its socket's connections came faster than its accept rate
	AcceptPacedUser   Reason = "accept_paced_user"   // a connection on the shared socket closed at accept, before its cgroup was read: its user connected faster than the accept rate
	AcceptPacedCgroup Reason = "accept_paced_cgroup" // a connection on the shared socket closed at accept: its cgroup connected faster than the accept rate
)

// Pool: slots and threads.
const (
	SlotsExhausted      Reason = "slots_exhausted"        // all slots of a container busy
	ContainersExhausted Reason = "containers_exhausted"   // a container over the cap on served containers
	ContainerNotFound   Reason = "container_not_found"    // a container's cgroup was not found
	ContainerGone       Reason = "container_gone"         // a served container's cgroup went away: its pool is stale
	PoolConfig          Reason = "pool_config"            // a container's pool settings are invalid
	StaleTID            Reason = "stale_tid"              // a recorded TID now names another thread: not moved
	AgentThreadInSlot   Reason = "agent_thread_in_slot"   // an agent thread found in a slot, moved back
	ForeignThreadInSlot Reason = "foreign_thread_in_slot" // v1: a thread of another container found in a slot (its fds passed on), moved back
	MkdirRefused        Reason = "mkdir_refused"          // the kernel refused a new slot (cgroup.max.descendants/depth)
	CreateFailed        Reason = "create_failed"
	OpenFailed          Reason = "open_failed"
	PlaceFailed         Reason = "place_failed"
	RetuneFailed        Reason = "retune_failed"
	RemoveFailed        Reason = "remove_failed"
	TeardownFailed      Reason = "teardown_failed"
	PrewarmFailed       Reason = "prewarm_failed"
	ReadUsage           Reason = "read_usage"
	NRIFailOpen         Reason = "nri_fail_open" // NRI: a selected container started (or was resized) before the agent had served it; the pod watch catches up
)

// CgroupOps are the cgroup file operations timed by
// cpuslot_cgroup_operation_duration_seconds{operation} (cgroup.Op*); a
// failed one counts as the error reason "cgroup_<operation>".
var CgroupOps = []string{"mkdir", "set_quota", "place", "move_out", "rmdir", "read_stat"}

// cgroupReason is the error reason of a failed cgroup operation.
func cgroupReason(op string) Reason { return Reason("cgroup_" + op) }

// ErrorReasons lists every Reason, cgroup operations included.
var ErrorReasons = func() []Reason {
	r := []Reason{
		BadRequest, BadFrame, NoHello, NotServed, UnknownLease, ConnectionLimit, FDsRevoked, AcceptFailed, SocketFailed, UsageThrottled, UsageOverclaimed, HoldListThrottled, SleepThrottled, FramePaced, PlacementPaced,
		AcceptPaced, AcceptPacedUser, AcceptPacedCgroup,
		SlotsExhausted, ContainersExhausted, ContainerNotFound, ContainerGone, PoolConfig, StaleTID,
		AgentThreadInSlot, ForeignThreadInSlot, MkdirRefused, CreateFailed, OpenFailed, PlaceFailed, RetuneFailed, RemoveFailed,
		TeardownFailed, PrewarmFailed, ReadUsage, NRIFailOpen,
	}
	for _, op := range CgroupOps {
		r = append(r, cgroupReason(op))
	}
	return r
}()

// AdmissionResult is what happened to an acquisition that did not fit the
// CPU budget at once (cpuslot_admission_total{result}).
type AdmissionResult string

const (
	Queued              AdmissionResult = "queued"                // waited for budget
	Degraded            AdmissionResult = "degraded"              // granted a smaller quota
	Rejected            AdmissionResult = "rejected"              // refused (also a RECLAIM that does not fit)
	AdmissionTimeout    AdmissionResult = "timeout"               // waited past its wait budget
	ReclaimedOverBudget AdmissionResult = "reclaimed_over_budget" // a slot adopted after a restart, reclaimed beyond the budget
)

// AdmissionResults lists every AdmissionResult.
var AdmissionResults = []AdmissionResult{Queued, Degraded, Rejected, AdmissionTimeout, ReclaimedOverBudget}
