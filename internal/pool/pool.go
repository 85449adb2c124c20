// Package pool leases a container's CPU slots to invocations: it keeps
// slots pre-warmed per quota, picks one per acquisition according to the
// pool's mode, admits requests against the container's CPU budget, and
// accounts what each lease used.
package pool

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// SlotIO is one slot's cgroup (cgroup.Slot in production).
type SlotIO interface {
	// OpenFDs opens the fds a client gets: placement fds, then counter
	// fds. The caller closes them.
	OpenFDs() ([]int, error)
	Spec() cgroup.Spec
	Place(tid int) error
	Retune(cgroup.Spec) error
	Usage() (cgroup.Usage, error)
	Remove() error
	Close()
}

// Backend is a container's cgroup (cgroup.Container in production).
type Backend interface {
	CreateSlot(id uint32, spec cgroup.Spec) (SlotIO, error)
	AdoptSlots() (map[uint32]SlotIO, error)
	// MoveOut moves a thread out of its slot, back to the container.
	MoveOut(tid int) error
	LimitMilli() (uint32, error)
	// Unprepare undoes what preparing the container changed, once no
	// slot is left.
	Unprepare() error
	// Close releases what the backend holds open (the container's
	// directory fds).
	Close()
}

// Thread identifies a client thread: its id in its own PID namespace and
// that namespace.
type Thread struct {
	NS  uint64
	TID uint32
}

// Request asks for a slot.
type Request struct {
	// Owner is the connection the lease belongs to.
	Owner      any
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
	Outcome  metrics.Acquisition
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
	// last holds the counters at the end of the previous lease: the start
	// of the next one, so an acquisition reads no file.
	last cgroup.Usage
}

type lease struct {
	id      uint64
	owner   any
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
	// seen is how far the slot's counters were credited to the process
	// (HOLD leases; see credit).
	seen cgroup.Usage
	// heldUntil is how far the lease's held time was credited to the
	// process as invocations it may report (HOLD leases; see credit).
	heldUntil time.Time
}

type holder struct {
	owner  any
	thread Thread
}

var leaseSeq atomic.Uint64

// Pool is the set of slots of one container.
type Pool struct {
	name    string
	cfg     settings.Pool
	mode    mode
	policy  admission.Policy
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
	// held finds the lease a thread of a client process holds.
	held map[holder]*lease
	// holds counts the HOLD leases of each client process.
	holds map[any]int
	// credits bounds what each process may report in USAGE.
	credits map[any]*credit
	budget  *admission.Budget
	// lent is what sleeping leases lend now; wakes counts their wakes.
	lent    uint32
	wakes   uint64
	nextID  uint32
	changed chan struct{} // closed when a slot or budget frees up
	closed  bool
	// io counts cgroup I/O in progress outside the lock; Close waits for
	// it (ioDone) before it removes slots, so a slot being created is not
	// left behind.
	io     int
	ioDone *sync.Cond
	// stale is set when the container's cgroup turned out to be gone.
	stale atomic.Bool
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
	mode, err := ParseMode(cfg.Mode)
	if err != nil {
		return nil, err
	}
	policy, err := admission.ParsePolicy(cfg.Policy)
	if err != nil {
		return nil, err
	}
	limit, err := b.LimitMilli()
	if err != nil {
		return nil, fmt.Errorf("reading the container's CPU limit: %w", err)
	}
	base := cfg.BudgetMilli
	if base == 0 {
		base = limit
	}
	md, ok := modes[mode]
	if !ok {
		return nil, fmt.Errorf("unknown mode %d", mode)
	}
	p := &Pool{
		name: name, cfg: cfg, mode: md, policy: policy, backend: b, metrics: m,
		slots: map[uint32]*slot{}, byThread: map[Thread]*slot{}, leases: map[uint64]*lease{}, held: map[holder]*lease{},
		holds:   map[any]int{},
		credits: map[any]*credit{},
		budget:  admission.New(base, cfg.Overcommit, policy, cfg.MinDegradedMilli),
		nextID:  1,
		changed: make(chan struct{}),
		actions: map[string]bool{},
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
	if a == metrics.Held {
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

// maxQuota is the largest quota a request may ask for: the container's
// CPU limit, else the configured maximum (by default the node's CPUs).
func (p *Pool) maxQuota() uint32 {
	if l := p.limit(); l > 0 {
		return l
	}
	return p.cfg.MaxQuotaMilli
}

// limit is the container's CPU limit the pool serves within (0: none): the
// cgroup's, or the one its orchestrator asks for when that is lower.
func (p *Pool) limit() uint32 {
	c, a := p.containerLimit.Load(), p.askedLimit.Load()
	if c == 0 || (a > 0 && a < c) {
		return a
	}
	return c
}

// RefreshLimit re-reads the container's CPU limit, which an in-place
// resize changes while the container runs, and returns the limit before
// and now (0: none). Under a lower limit requests above it are refused
// (INVALID_QUOTA, as for a container that started with that limit), a
// budget that follows the limit shrinks, and Reap removes the free slots
// above it; a leased one goes once it is released (until then the kernel
// caps it at the container's limit anyway). Under a higher limit the
// budget grows and the pre-warmed slots that fit again are made.
func (p *Pool) RefreshLimit() (before, now uint32, err error) {
	now, err = p.backend.LimitMilli()
	if err != nil {
		return 0, 0, fmt.Errorf("reading the container's CPU limit: %w", err)
	}
	before = p.containerLimit.Load()
	if now == before {
		return before, now, nil
	}
	return before, now, p.setLimit(&p.containerLimit, now, "container CPU limit changed")
}

// AskLimit is the CPU limit the container's orchestrator asks for before
// the kernel has it (a resize in the pod's spec; 0: none). Below the
// cgroup's limit the pool serves within it at once, and the free slots
// above it are removed now: cgroup v1 refuses a container a quota below a
// child's, so they would make the resize fail.
func (p *Pool) AskLimit(milli uint32) error {
	if p.askedLimit.Load() == milli {
		return nil
	}
	err := p.setLimit(&p.askedLimit, milli, "container CPU limit asked")
	p.Reap(time.Now())
	return err
}

// setLimit stores one of the pool's limits and applies what changed: the
// budget (when it follows the limit), waiting requests, and the pre-warmed
// slots that fit again under a higher limit.
func (p *Pool) setLimit(which *atomic.Uint32, milli uint32, what string) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	before, maxBefore := p.limit(), p.maxQuota()
	which.Store(milli)
	now := p.limit()
	if p.cfg.BudgetMilli == 0 && now != before {
		// Leases granted under the old budget keep their share of it.
		b := admission.New(now, p.cfg.Overcommit, p.policy, p.cfg.MinDegradedMilli)
		b.Take(p.budget.Used())
		p.budget = b
	}
	raises := p.planRaises()
	p.broadcast() // waiting requests see the new limit and budget
	p.mu.Unlock()
	p.raise(raises)
	slog.Info(what, "container", p.name, "to", formatLimit(milli), "servedWithin", formatLimit(now), "was", formatLimit(before))
	if p.maxQuota() > maxBefore && p.mode.keepsSlots() {
		return p.prewarm()
	}
	return nil
}

func formatLimit(m uint32) string {
	if m == 0 {
		return "none"
	}
	return FormatQuota(m)
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

// Start adopts the slots an earlier agent left, retunes those made with
// other settings, and creates what the prewarm spec still lacks.
func (p *Pool) Start() error {
	adopted, err := p.backend.AdoptSlots()
	if err != nil {
		return fmt.Errorf("adopting existing slots: %w", err)
	}
	now := time.Now()
	p.mu.Lock()
	for id, io := range adopted {
		s := &slot{id: id, io: io, spec: io.Spec(), freeSince: now, adopted: true}
		p.slots[id] = s
		if id >= p.nextID {
			p.nextID = id + 1
		}
	}
	p.mu.Unlock()
	for _, s := range p.snapshotSlots() {
		want := s.spec
		want.PeriodUS, want.Limit = p.cfg.PeriodUS, p.cfg.Limit
		if !p.mode.keepsSlots() || want.Validate() != nil || want.QuotaMilli > p.maxQuota() {
			p.removeSlot(s, "adopted slot not usable by this pool")
			continue
		}
		if u, err := s.io.Usage(); err == nil {
			s.last = u
		}
		if want != s.spec {
			if err := s.io.Retune(want); err != nil {
				p.removeSlot(s, "adopted slot could not be retuned")
				continue
			}
			s.spec = want
		}
	}
	if !p.mode.keepsSlots() {
		return nil
	}
	return p.prewarm()
}

func (p *Pool) snapshotSlots() []*slot {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*slot, 0, len(p.slots))
	for _, s := range p.slots {
		out = append(out, s)
	}
	return out
}

// prewarm creates the slots the prewarm spec asks for and that are missing.
func (p *Pool) prewarm() error {
	have := map[uint32]int{}
	p.mu.Lock()
	for _, s := range p.slots {
		have[s.spec.QuotaMilli]++
	}
	p.mu.Unlock()
	var errs []error
	for q, n := range p.cfg.Prewarm {
		if q > p.maxQuota() {
			errs = append(errs, fmt.Errorf("prewarm %dm is above the largest quota of %dm (the container's CPU limit, else the configured maximum)", q, p.maxQuota()))
			continue
		}
		for i := have[q]; i < n; i++ {
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				return errors.Join(errs...)
			}
			s := &slot{id: p.allocID(), spec: p.spec(q), busy: true}
			p.slots[s.id] = s
			p.beginIO()
			p.mu.Unlock()
			io, err := p.backend.CreateSlot(s.id, s.spec)
			p.mu.Lock()
			if err == nil {
				s.io, s.spec, s.busy, s.freeSince = io, io.Spec(), false, time.Now()
			} else {
				delete(p.slots, s.id)
			}
			p.endIO()
			p.mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return errors.Join(errs...)
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
		if p.holds[l.owner]--; p.holds[l.owner] <= 0 {
			delete(p.holds, l.owner)
		}
		return
	}
	if k := (holder{l.owner, l.thread}); p.held[k] == l {
		delete(p.held, k)
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

// ReleaseOwner releases every lease of a connection that went away.
func (p *Pool) ReleaseOwner(owner any) int {
	p.mu.Lock()
	var ids []uint64
	for id, l := range p.leases {
		if l.owner == owner {
			ids = append(ids, id)
		}
	}
	waiting := p.credits[owner] != nil && len(p.credits[owner].pending) > 0
	p.mu.Unlock()
	// What its reports claimed and the agent has not counted yet is
	// settled against its slots' counters before they go.
	if waiting {
		p.settle(owner, time.Now())
	}
	for _, id := range ids {
		_, _ = p.Release(owner, id, metrics.Abandoned)
	}
	p.mu.Lock()
	delete(p.credits, owner)
	p.mu.Unlock()
	return len(ids)
}

// Reclaim re-declares a lease held across a reconnect: the slot is leased
// to owner without any cgroup write (the thread is already in it). It goes
// through admission: beyond the budget only a slot adopted from an earlier
// agent and not leased since is reclaimed (an invocation of before the
// restart may run in it); it is counted, and its quota counts against the
// budget, so it never makes room for more.
func (p *Pool) Reclaim(owner any, slotID, quota uint32, t Thread, action string) (*Grant, error) {
	return p.reclaim(owner, slotID, t, action, false)
}

// ReclaimHold re-declares a HOLD lease held across a reconnect, as Reclaim
// does a thread's lease. A process holds at most MaxSlots HOLD leases, also
// after a restart that adopted more slots: a reclaim beyond is refused.
func (p *Pool) ReclaimHold(owner any, slotID, quota uint32) (*Grant, error) {
	if !p.GrantsHold() {
		return nil, errorf(BadRequest, "this pool's mode (%s) grants no HOLD leases", p.cfg.Mode)
	}
	return p.reclaim(owner, slotID, Thread{}, "", true)
}

func (p *Pool) reclaim(owner any, slotID uint32, t Thread, action string, hold bool) (*Grant, error) {
	p.mu.Lock()
	s := p.slots[slotID]
	if p.closed {
		p.mu.Unlock()
		return nil, errorf(Closing, "pool %s is closing", p.name)
	}
	if s != nil && s.lease != nil && s.lease.owner == owner && !s.busy {
		// The process re-declares a lease it still holds (one of its
		// connections died, others did not): same lease, new id.
		l := s.lease
		delete(p.leases, l.id)
		l.id = leaseSeq.Add(1)
		p.leases[l.id] = l
		return p.reclaimed(s, l)
	}
	if s == nil || s.lease != nil || s.busy {
		p.mu.Unlock()
		return nil, errorf(UnknownLease, "slot %d is unknown or leased to another process", slotID)
	}
	q := s.spec.QuotaMilli
	if hold && p.holds[owner] >= p.cfg.MaxSlots {
		p.mu.Unlock()
		p.metrics.Admission(metrics.Rejected)
		return nil, errorf(Rejected, "reclaim of slot %d: the process holds %d HOLD leases, the most a process may (maxSlots)", slotID, p.holds[owner])
	}
	if !p.budget.Fits(q) {
		if !s.adopted {
			p.mu.Unlock()
			p.metrics.Admission(metrics.Rejected)
			return nil, errorf(Rejected, "reclaim of slot %d (%dm) does not fit: %dm of %dm budget granted", slotID, q, p.budget.Used(), p.budget.Limit)
		}
		p.metrics.Admission(metrics.ReclaimedOverBudget)
		slog.Warn("reclaim beyond the budget honoured after a restart", "container", p.name, "slot", slotID, "quota", q, "used", p.budget.Used(), "budget", p.budget.Limit)
	}
	l := &lease{id: leaseSeq.Add(1), owner: owner, slot: s, thread: t, want: q, granted: q, action: p.actionLabel(action), start: s.last, hold: hold, seen: s.last, heldUntil: time.Now()}
	s.lease, s.adopted = l, false
	p.leases[l.id] = l
	p.budget.Take(l.granted)
	if hold {
		l.action = metrics.Held
		p.holds[owner]++
	} else {
		p.held[holder{owner, t}] = l
		p.setOccupant(s, t, 0, 0)
	}
	p.metrics.Acquired(p.cfg.Mode, metrics.Reclaimed, 0)
	return p.reclaimed(s, l)
}

// reclaimed answers a reclaim; it is called with the lock held and
// releases it. A reclaim sends no fds (the thread sits in the slot already).
func (p *Pool) reclaimed(s *slot, l *lease) (*Grant, error) {
	defer p.mu.Unlock()
	return &Grant{Lease: l.id, SlotID: s.id, Spec: s.spec, Outcome: metrics.AffinityHit, Place: PlaceNone}, nil
}

// Reap removes grown slots that stayed free longer than the idle timeout,
// keeping the pre-warmed count of each quota, and free slots above the
// container's CPU limit (it was lowered).
func (p *Pool) Reap(now time.Time) int {
	p.settleDue(now)
	max := p.maxQuota()
	p.mu.Lock()
	count := map[uint32]int{}
	for _, s := range p.slots {
		count[s.spec.QuotaMilli]++
	}
	var victims []*slot
	for _, s := range p.slots {
		q := s.spec.QuotaMilli
		idle := count[q] > p.cfg.Prewarm[q] && now.Sub(s.freeSince) >= p.cfg.IdleTimeout
		if !p.closed && s.lease == nil && !s.busy && (idle || q > max) {
			count[q]--
			s.busy = true
			victims = append(victims, s)
			p.beginIO()
		}
	}
	p.mu.Unlock()
	for _, s := range victims {
		why := "idle"
		if s.spec.QuotaMilli > max {
			why = "above the container's CPU limit of " + FormatQuota(max)
		}
		p.removeSlot(s, why)
	}
	p.mu.Lock()
	for range victims {
		p.endIO()
	}
	p.mu.Unlock()
	return len(victims)
}

// removeSlot removes a slot the caller made busy (or that nobody else sees).
func (p *Pool) removeSlot(s *slot, why string) {
	err := s.io.Remove()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.metrics.Error(metrics.RemoveFailed)
		s.busy = false // try again at the next reap
		return
	}
	if s.occupant != (Thread{}) {
		delete(p.byThread, s.occupant)
	}
	delete(p.slots, s.id)
	slog.Info("slot removed", "container", p.name, "slot", s.id, "quota", FormatQuota(s.spec.QuotaMilli), "reason", why)
	p.broadcast()
}

// Close stops the pool. With remove, every slot is removed (threads moved
// back to the container) and the container's preparation undone: the
// container is gone or no longer served. Without, the slots stay for the
// next agent to adopt and running invocations keep their fds.
//
// Close first waits for cgroup I/O in progress (a slot being created would
// otherwise be left behind). Fds are never closed under a grant: a grant
// owns the fds opened for it.
func (p *Pool) Close(remove bool) error {
	p.mu.Lock()
	p.closed = true
	p.broadcast()
	for p.io > 0 {
		p.ioDone.Wait()
	}
	slots := make([]*slot, 0, len(p.slots))
	for _, s := range p.slots {
		if s.io != nil {
			slots = append(slots, s)
		}
	}
	p.slots = map[uint32]*slot{}
	p.leases = map[uint64]*lease{}
	p.held = map[holder]*lease{}
	p.holds = map[any]int{}
	p.credits = map[any]*credit{}
	p.mu.Unlock()
	// Nothing counts for the container any more (settle checks closed).
	p.metrics.ForgetContainer(p.name)
	var errs []error
	var left []*slot
	for _, s := range slots {
		if remove {
			if err := s.io.Remove(); err != nil {
				errs = append(errs, err)
				if errors.Is(err, cgroup.ErrBusy) {
					left = append(left, s)
				}
			}
		} else {
			s.io.Close()
		}
	}
	if len(left) > 0 && !p.stale.Load() {
		// Removed later (RemoveLeft), once the container's threads are
		// gone; the backend stays open until then.
		p.mu.Lock()
		p.left = left
		p.mu.Unlock()
		return errors.Join(errs...)
	}
	if remove && len(errs) == 0 {
		if err := p.backend.Unprepare(); err != nil {
			errs = append(errs, err)
		}
	}
	p.backend.Close()
	if p.stale.Load() {
		// The container's cgroup is gone, and its slots with it.
		for _, err := range errs {
			if !errors.Is(err, cgroup.ErrGone) {
				return errors.Join(errs...)
			}
		}
		return nil
	}
	return errors.Join(errs...)
}

// RemoveLeft tries again to remove the slots Close(true) left behind
// (ErrBusy: threads kept arriving), then undoes the container's
// preparation and releases the backend. done is false while a slot still
// has threads arriving; once done, err says what failed, if anything (a
// slot already gone counts as removed). With last, slots still busy are
// given up: their descriptors and the backend's are closed.
func (p *Pool) RemoveLeft(last bool) (done bool, err error) {
	p.mu.Lock()
	left := p.left
	p.mu.Unlock()
	if len(left) == 0 {
		return true, nil // nothing left, the backend already released
	}
	var still []*slot
	var errs, busy []error
	for _, s := range left {
		if err := s.io.Remove(); err != nil {
			if errors.Is(err, cgroup.ErrBusy) {
				still = append(still, s)
				busy = append(busy, err) // says why: threads, or a child cgroup
			} else if !errors.Is(err, cgroup.ErrGone) && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if len(still) > 0 && !last {
		p.mu.Lock()
		p.left = still
		p.mu.Unlock()
		return false, fmt.Errorf("%d slot(s) not removed yet: %w", len(still), errors.Join(busy...))
	}
	p.mu.Lock()
	p.left = nil
	p.mu.Unlock()
	if len(still) > 0 {
		// Given up: release what they hold open, so that a container that
		// keeps entering them leaks no descriptor.
		for _, s := range still {
			s.io.Close()
		}
		errs = append(errs, fmt.Errorf("%d slot(s) given up: %w", len(still), errors.Join(busy...)))
	} else if len(errs) == 0 {
		if err := p.backend.Unprepare(); err != nil && !errors.Is(err, cgroup.ErrGone) && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	p.backend.Close()
	return true, errors.Join(errs...)
}

// Summary describes the pool per quota, for HELLO and /debug/pools.
type Summary struct {
	Name        string `json:"name"`
	Mode        string `json:"mode"`
	BudgetMilli uint32 `json:"budgetMilli"`
	UsedMilli   uint32 `json:"usedMilli"`
	Leases      int    `json:"leases"`
	Degraded    int    `json:"degraded"`
	// LentMilli is the quota sleeping leases lend now (not in UsedMilli).
	LentMilli uint32 `json:"lentMilli"`
	// Wakes counts the sleeping leases woken since the pool started.
	Wakes  uint64        `json:"wakes"`
	Quotas []QuotaStatus `json:"quotas"`
}

// QuotaStatus counts the slots of one quota.
type QuotaStatus struct {
	QuotaMilli uint32 `json:"quotaMilli"`
	PeriodUS   uint32 `json:"periodUS"`
	Slots      int    `json:"slots"`
	Free       int    `json:"free"`
	Leased     int    `json:"leased"`
	Prewarm    int    `json:"prewarm"`
}

// Summary reports the pool's state.
func (p *Pool) Summary() Summary {
	p.mu.Lock()
	defer p.mu.Unlock()
	byQ := map[uint32]*QuotaStatus{}
	get := func(q uint32) *QuotaStatus {
		if byQ[q] == nil {
			byQ[q] = &QuotaStatus{QuotaMilli: q, PeriodUS: p.cfg.PeriodUS, Prewarm: p.cfg.Prewarm[q]}
		}
		return byQ[q]
	}
	for q := range p.cfg.Prewarm {
		get(q)
	}
	for _, s := range p.slots {
		st := get(s.spec.QuotaMilli)
		st.Slots++
		switch {
		case s.lease != nil:
			st.Leased++
		case !s.busy:
			st.Free++
		}
	}
	sum := Summary{Name: p.name, Mode: p.cfg.Mode, BudgetMilli: p.budget.Limit, UsedMilli: p.budget.Used(),
		Leases: len(p.leases), Degraded: len(p.degraded), LentMilli: p.lent, Wakes: p.wakes}
	for _, st := range byQ {
		sum.Quotas = append(sum.Quotas, *st)
	}
	sortQuotas(sum.Quotas)
	return sum
}

func sortQuotas(q []QuotaStatus) {
	for i := 1; i < len(q); i++ {
		for j := i; j > 0 && q[j].QuotaMilli < q[j-1].QuotaMilli; j-- {
			q[j], q[j-1] = q[j-1], q[j]
		}
	}
}
