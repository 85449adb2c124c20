// Package pool leases a container's CPU slots to invocations: it keeps
// slots pre-warmed per quota, picks one per acquisition according to the
// pool's mode, admits requests against the container's CPU budget, and
// accounts what each lease used.
package pool

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/outcome"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// Thread identifies a client thread: its id in its own PID namespace and
// that namespace.
type Thread struct {
	NS  uint64
	TID uint32
}

// Owner is who leases belong to: one client connection, so that its
// leases end when it goes (ReleaseOwner) and only it can end or report
// them. NewOwner gives each its own.
type Owner uint64

var ownerSeq atomic.Uint64

// NewOwner returns an Owner no other has.
func NewOwner() Owner { return Owner(ownerSeq.Add(1)) }

// Request asks for a slot.
type Request struct {
	// Owner is the connection the lease belongs to.
	Owner      Owner
	QuotaMilli uint32
	Thread     Thread
	// CurrentSlot is where the client says the thread sits (0: unknown).
	CurrentSlot uint32
	// AgentPlaces asks the agent to place the thread (client without fds).
	AgentPlaces bool
	// HostTID resolves the thread's id in the agent's PID namespace; it is
	// called only when the agent writes the TID itself.
	HostTID func() (int, error)
	// NeedFDs reports whether the connection still lacks a slot's fds
	// (nil: it never takes fds).
	NeedFDs    func(slot uint32) bool
	Wait       time.Duration
	Action     string
	Invocation string
	// Hold asks for a HOLD lease (local leasing): a slot leased to the
	// client process, which leases it to its threads itself. It has no
	// thread, no action and no invocation, and ends no other lease.
	Hold bool
}

// Grant is a leased slot.
type Grant struct {
	Lease  uint64
	SlotID uint32
	// FDs are the slot's placement fds followed by its counter fds, opened
	// for this grant when the connection needs them; the receiver sends
	// them and calls CloseFDs.
	FDs      []int
	Spec     cgroup.Spec
	Outcome  outcome.Acquisition
	Queued   bool
	Degraded bool
	Place    Place
}

// CloseFDs closes the fds opened for the grant.
func (g *Grant) CloseFDs() {
	for _, fd := range g.FDs {
		unix.Close(fd)
	}
	g.FDs = nil
}

type slot struct {
	id    uint32
	io    SlotIO
	spec  cgroup.Spec
	lease *lease
	// busy marks cgroup I/O in progress outside the pool lock.
	busy bool
	// raising marks a retune in progress that gives a degraded lease more;
	// the slot stays busy after the lease's release until it is done.
	raising bool
	// adopted marks a slot an earlier agent left that nobody has leased
	// since: an invocation of before a restart may still run in it, so a
	// RECLAIM of it is honoured even beyond the budget.
	adopted bool
	// occupant is the last thread granted the slot; with lazy reuse it
	// still sits there after release. occupantHost is its host TID when
	// the agent placed it (0: unknown).
	occupant     Thread
	occupantHost int
	// occupantStart is the start time of occupantHost: a TID is moved only
	// while it still names the same thread.
	occupantStart uint64
	freeSince     time.Time
	// retired marks a slot that held a foreign thread: it is removed as
	// soon as it is free (retire.go). exposed marks one whose threads
	// placed themselves (its fds are out there, v1), or that an earlier
	// agent left: only such a slot can hold a foreign thread.
	retired, exposed bool
	// last holds the counters at the end of the previous lease: the start
	// of the next one, so an acquisition reads no file.
	last cgroup.Usage
}

type lease struct {
	id      uint64
	owner   Owner
	slot    *slot
	thread  Thread
	hostTID int
	// hostStart is the start time of hostTID when it was granted.
	hostStart uint64
	want      uint32 // asked; more than granted while degraded
	granted   uint32
	start     cgroup.Usage
	action    string
	degraded  bool
	// hold marks a HOLD lease: the process's, no thread's.
	hold bool
	// sleeping marks a lease its runtime said sleeps; lent is the part of
	// granted admission lends meanwhile (not charged to the budget).
	sleeping bool
	lent     uint32
	// lentAt is when it last lent; lendArmed: a timer lends its share a
	// period after that if it sleeps then (lend).
	lentAt    time.Time
	lendArmed bool
	// seen is how far the slot's counters were credited to the process
	// (HOLD leases; see credit).
	seen cgroup.Usage
	// heldUntil is how far the lease's held time was credited to the
	// process as invocations it may report (HOLD leases; see credit).
	heldUntil time.Time
}

// ownerThread is a client thread within the connection holding its lease.
type ownerThread struct {
	owner  Owner
	thread Thread
}

var leaseSeq atomic.Uint64

// Pool is the set of slots of one container.
type Pool struct {
	name    string
	cfg     settings.Pool
	mode    mode
	backend Backend
	metrics *metrics.Metrics
	// containerLimit is the container's own CPU limit (0: none); an
	// in-place resize changes it (RefreshLimit). askedLimit is the one its
	// orchestrator asks for, applied or not yet (AskLimit; 0: none).
	containerLimit, askedLimit atomic.Uint32

	mu       sync.Mutex
	slots    map[uint32]*slot
	byThread map[Thread]*slot
	leases   map[uint64]*lease
	// threadLeases finds the thread lease a thread of a client process holds.
	threadLeases map[ownerThread]*lease
	// holdCount counts the HOLD leases of each client process.
	holdCount map[Owner]int
	// credits bounds what each process may report in USAGE.
	credits map[Owner]*credit
	budget  *admission.Budget
	// lent is what sleeping leases lend now; wakes counts their wakes,
	// lends the sleeps that lent quota, givebacks the lent quotas ended
	// (by a wake or a release), cuts the awake leases lowered by wakes.
	lent                    uint32
	wakes, lends, givebacks uint64
	cuts                    uint64
	// cutsOwed: a wake left the budget exceeded because the leases it
	// would cut were being raised; the end of a retune cuts them then.
	cutsOwed bool
	nextID   uint32
	changed  chan struct{} // closed when a slot or budget frees up
	closed   bool
	// io counts cgroup I/O in progress outside the lock; Close waits for
	// it (ioDone) before it removes slots, so a slot being created is not
	// left behind.
	io     int
	ioDone *sync.Cond
	// stale is set when the container's cgroup turned out to be gone.
	stale atomic.Bool
	// fdsRevoked is until when (unix ns) clients are refused fds;
	// fdIncidents how many times they were (RevokeFDs).
	fdsRevoked  atomic.Int64
	fdIncidents int
	// actions are the action names this container has used as metric
	// labels (at most cfg.MaxActions).
	actions map[string]bool
	// degraded leases in grant order, raised as budget frees.
	degraded []*lease
	// left are the slots Close(true) could not remove because threads
	// kept arriving (a container's process placing its threads while it
	// ends); RemoveLeft tries them again. The backend stays open for them.
	left []*slot
}

// New makes a pool for one container from its settings; call Start to
// adopt and pre-warm.
func New(name string, cfg settings.Pool, b Backend, m *metrics.Metrics) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxQuotaMilli == 0 {
		cfg.MaxQuotaMilli = settings.NodeMaxQuota()
	}
	limit, err := b.LimitMilli()
	if err != nil {
		return nil, fmt.Errorf("reading the container's CPU limit: %w", err)
	}
	base := cfg.BudgetMilli
	if base == 0 {
		base = limit
	}
	md, ok := modes[cfg.Mode]
	if !ok {
		return nil, fmt.Errorf("mode %q has no implementation", cfg.Mode)
	}
	p := &Pool{
		name: name, cfg: cfg, mode: md, backend: b, metrics: m,
		slots: map[uint32]*slot{}, byThread: map[Thread]*slot{}, leases: map[uint64]*lease{}, threadLeases: map[ownerThread]*lease{},
		holdCount: map[Owner]int{},
		credits:   map[Owner]*credit{},
		budget:    admission.New(base, cfg.Overcommit, cfg.Policy, cfg.MinDegradedMilli),
		nextID:    1,
		changed:   make(chan struct{}),
		actions:   map[string]bool{},
	}
	p.containerLimit.Store(limit)
	p.ioDone = sync.NewCond(&p.mu)
	return p, nil
}

// beginIO marks cgroup I/O about to run outside the lock; the caller holds
// the lock.
func (p *Pool) beginIO() { p.io++ }

// endIO ends what beginIO began; the caller holds the lock.
func (p *Pool) endIO() {
	if p.io--; p.io == 0 {
		p.ioDone.Broadcast()
	}
}

// Stale reports that the container's cgroup is gone (removed, perhaps made
// again at the same path): the pool serves nothing any more.
func (p *Pool) Stale() bool { return p.stale.Load() }

// Invalidate marks the pool stale: its container's cgroup is gone.
func (p *Pool) Invalidate() { p.stale.Store(true) }

// checkGone marks the pool stale when err says the container is gone, and
// turns err into the client's cue to reconnect.
func (p *Pool) checkGone(err error) error {
	if !errors.Is(err, cgroup.ErrGone) {
		return nil
	}
	if !p.stale.Swap(true) {
		slog.Warn("container cgroup is gone; its pool is stale", "container", p.name, "err", err)
		p.metrics.Error(metrics.ContainerGone)
	}
	return errorf(Closing, "container %s was removed; reconnect", p.name)
}

// actionLabel is the metric label of an action name: its own name while the
// container has used fewer than MaxActions names, else "_other". The cap is
// per container, so one container's flood of names costs no other its own.
// The caller holds the lock.
func (p *Pool) actionLabel(a string) string {
	if a == outcome.HoldAction {
		return "_other" // the agent's own measure of HOLD leases is not a client's to feed
	}
	if a == "" || p.actions[a] {
		return a
	}
	if len(p.actions) >= p.cfg.MaxActions {
		return "_other"
	}
	p.actions[a] = true
	return a
}

// Name is the pool's container identity.
func (p *Pool) Name() string { return p.name }

// GrantsHold reports whether the pool grants HOLD leases (local leasing):
// only in the mode where clients place their threads themselves. The
// research baselines have the agent place every thread, which is what they
// measure.
func (p *Pool) GrantsHold() bool {
	_, ok := p.mode.(affinity)
	return ok
}

// AgentPlaces reports whether an acquisition has the agent write a thread's
// TID (agentPlaces: the client asked it to).
func (p *Pool) AgentPlaces(agentPlaces bool) bool { return p.mode.needsHostTID(agentPlaces) }

// MovesOnRelease reports whether a release has the agent move a thread.
func (p *Pool) MovesOnRelease() bool { return p.mode.movesOnRelease() }

func (p *Pool) spec(quota uint32) cgroup.Spec {
	return cgroup.Spec{QuotaMilli: quota, PeriodUS: p.cfg.PeriodUS, Limit: p.cfg.Limit}
}

func (p *Pool) allocID() uint32 {
	for p.slots[p.nextID] != nil || p.nextID == 0 {
		p.nextID++
	}
	id := p.nextID
	p.nextID++
	return id
}

// setOccupant records that thread t is (or is about to be) in slot s.
func (p *Pool) setOccupant(s *slot, t Thread, host int, hostStart uint64) {
	if old := p.byThread[t]; old != nil && old != s && old.occupant == t {
		old.occupant, old.occupantHost, old.occupantStart = Thread{}, 0, 0
	}
	if s.occupant != (Thread{}) && s.occupant != t {
		delete(p.byThread, s.occupant)
	}
	s.occupant, s.occupantHost, s.occupantStart = t, host, hostStart
	p.byThread[t] = s
}

func (p *Pool) forgetLease(l *lease) {
	delete(p.leases, l.id)
	if l.hold {
		if p.holdCount[l.owner]--; p.holdCount[l.owner] <= 0 {
			delete(p.holdCount, l.owner)
		}
		return
	}
	if k := (ownerThread{l.owner, l.thread}); p.threadLeases[k] == l {
		delete(p.threadLeases, k)
	}
}

func (p *Pool) dropDegraded(l *lease) {
	for i, d := range p.degraded {
		if d == l {
			p.degraded = append(p.degraded[:i], p.degraded[i+1:]...)
			return
		}
	}
}

func (p *Pool) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}
