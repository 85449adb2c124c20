package client

// Local leasing (SPEC.md, "Local leasing"): the process holds slots as HOLD
// leases, keeps them in a slot table, and its threads claim them with a
// compare-and-swap. An invocation then costs one write when the thread must
// move, nothing when it sits in the slot already, and a round trip to the
// agent only on a miss. Per-invocation usage travels later, summed, in
// one-way USAGE messages.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/counters"
)

const (
	defaultLocalIdle     = 30 * time.Second
	defaultTableCapacity = 128
	usageEvery           = time.Second
)

// errNoLocal: no held slot fits and the agent grants no HOLD leases (an
// agent without local leasing answered the last reconnect); the caller
// leases for the thread instead.
var errNoLocal = errors.New("cpuslot: agent grants no HOLD leases")

// local is a Client's local leasing state.
type local struct {
	c    *Client
	t    *slotv1.Table
	idle time.Duration
	// quit ends run, which closes ran when it returns: Close waits for
	// it before it closes the hold connection run may be using.
	quit, ran chan struct{}
	quitOnce  sync.Once

	// mu guards own; held off the invocation path (misses aside).
	mu sync.Mutex
	// own are the entries this process published: its HOLD leases, the
	// only entries it re-declares and drops. Lease ids come from here,
	// never from the table, which the process's own code may scribble on.
	own map[int]*ownEntry
	// closed: Close has dropped the free entries; a grant published after
	// that goes straight back.
	closed bool

	// qmu guards queue and asking: the threads waiting for an entry, in
	// arrival order, and the quotas a HOLD request is on its way for (one
	// at a time per quota). waiting counts queue: the fast path reads it
	// alone.
	qmu     sync.Mutex
	queue   []*waiter
	asking  map[uint32]bool
	waiting atomic.Int32
	// asks counts HOLD requests on their way: Close waits for their
	// grants, which no waiter may take any more, to give them back.
	asks sync.WaitGroup

	// cn is the connection the process's HOLD leases are granted on; they
	// are released, slept, woken, listed (HELD) and reported (USAGE) there
	// only (SPEC.md, "Lifetimes"). cmu: one request at a time on it (a
	// HOLD, HELD, RECLAIM); one-way frames go beside (sendBeside), so none
	// waits behind a HOLD that waits for budget. cnMu guards cn.
	cmu  sync.Mutex
	cnMu sync.Mutex
	cn   *conn

	usageMu sync.Mutex
	usage   map[usageKey]*slotv1.UsageRecord
	flushMu sync.Mutex // one flush at a time: Close's waits for the ticker's
	kick    chan struct{}
}

type ownEntry struct {
	slot  uint32
	quota uint32
	lease uint64
	gone  bool // the agent refused it after a reconnect
}

// waiter is a thread waiting for an entry of quota. Entries freed while
// threads wait go to them in arrival order before any thread claims one
// again, and so do HOLD leases the agent grants meanwhile: one queue for
// both, so that a thread holding an entry in a closed loop cannot keep it
// from a thread that waits.
type waiter struct {
	tid   int
	quota uint32
	got   chan served // buffered: whoever serves never blocks
}

// served is what a waiter gets: an entry claimed for it (ok set when the
// agent granted it just now), or the agent's refusal of its own request.
type served struct {
	cl  slotv1.Claim
	ok  *slotv1.AcquireOK
	err error
}

type usageKey struct {
	action  string
	outcome slotv1.ReleaseOutcome
}

func newLocal(c *Client) (*local, error) {
	lc := &local{c: c, idle: c.opts.LocalIdle, own: map[int]*ownEntry{}, usage: map[usageKey]*slotv1.UsageRecord{}, kick: make(chan struct{}, 1),
		asking: map[uint32]bool{}}
	if lc.idle <= 0 {
		lc.idle = defaultLocalIdle
	}
	if f := c.opts.TableFile; f != nil {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("cpuslot: slot table fd: %w", err)
		}
		if lc.t, err = slotv1.OpenTable(os.NewFile(uintptr(fd), "cpuslot-table")); err != nil {
			return nil, fmt.Errorf("cpuslot: slot table: %w", err)
		}
	} else {
		n := c.opts.TableCapacity
		if n <= 0 {
			n = defaultTableCapacity
		}
		t, err := slotv1.CreateTable(n)
		if err != nil {
			return nil, err
		}
		lc.t = t
	}
	lc.quit, lc.ran = make(chan struct{}), make(chan struct{})
	go lc.run()
	return lc, nil
}

// CLOCK_MONOTONIC, as idle_since wants it, read through Go's monotonic
// clock (vDSO) from one system call at start: a system call per release
// would cost more than the release.
var monoBase, monoStart = func() (int64, time.Time) {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano(), time.Now()
}()

func monotonicNow() uint64 { return uint64(monoBase + int64(time.Since(monoStart))) }

// acquire places the calling thread in a held slot of quotaMilli: the entry
// it used last (no write when it still sits there), else any free entry
// (one write), else it waits in the local queue for an entry another
// thread releases or a new HOLD lease (a round trip). While threads wait,
// newcomers queue behind them.
func (lc *local) acquire(ctx context.Context, tid int, quotaMilli uint32, action string) (*Lease, error) {
	if err := slotv1.CheckString(action); err != nil {
		return nil, fmt.Errorf("cpuslot: action: %w", err)
	}
	c, t := lc.c, lc.t
	c.mu.Lock()
	cur := c.current[tid]
	last, hasLast := c.lastEntry[tid]
	c.mu.Unlock()
	if !hasLast {
		last = -1
	}
	if lc.waiting.Load() == 0 {
		now := monotonicNow()
		// (1) The thread's last entry.
		if hasLast && t.Match(last, quotaMilli) {
			if cl, r := t.Claim(last, uint32(tid), quotaMilli, now); r == slotv1.Claimed {
				if l, err := lc.use(tid, cl, cur, last, action, slotv1.OutcomeAffinityHit); err == nil {
					return l, nil
				}
			}
		}
		// (2) Any free entry of the quota.
		if cl, ok := lc.claimFree(tid, quotaMilli); ok {
			if l, err := lc.use(tid, cl, cur, last, action, slotv1.OutcomeCacheHit); err == nil {
				return l, nil
			}
		}
	}
	// (3) Wait in turn.
	if !c.localOn.Load() {
		return nil, errNoLocal
	}
	for {
		s := lc.wait(ctx, tid, quotaMilli)
		if s.err != nil {
			return nil, s.err
		}
		if s.ok == nil {
			l, err := lc.use(tid, s.cl, cur, last, action, slotv1.OutcomeCacheHit)
			if err == nil {
				return l, nil
			}
			continue // given back as not usable: wait again
		}
		l, err := lc.use(tid, s.cl, 0, -1, action, s.ok.Outcome)
		if err != nil {
			return nil, fmt.Errorf("cpuslot: placing thread in slot %d: %w", s.ok.Slot, err)
		}
		l.Queued = s.ok.Flags&slotv1.AcquiredQueued != 0
		if s.ok.Place == slotv1.PlaceNone {
			l.Outcome = s.ok.Outcome
		}
		return l, nil
	}
}

// claimFree claims any free entry of quotaMilli for thread tid, starting at
// a place of the thread's own so that threads do not all race for the
// first one.
func (lc *local) claimFree(tid int, quotaMilli uint32) (slotv1.Claim, bool) {
	t := lc.t
	n := t.Cap()
	from := tid % n
	now := monotonicNow()
	for k := 0; k < n; k++ {
		i := from + k
		if i >= n {
			i -= n
		}
		if !t.Match(i, quotaMilli) {
			continue
		}
		if cl, r := t.Claim(i, uint32(tid), quotaMilli, now); r == slotv1.Claimed {
			return cl, true
		}
	}
	return slotv1.Claim{}, false
}

// claimOwn claims a free entry of quotaMilli this process published for
// thread tid.
func (lc *local) claimOwn(tid int, quotaMilli uint32) (slotv1.Claim, bool) {
	now := monotonicNow()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for i, o := range lc.own {
		if o.gone || !lc.t.Match(i, quotaMilli) {
			continue
		}
		if cl, r := lc.t.Claim(i, uint32(tid), quotaMilli, now); r == slotv1.Claimed {
			return cl, true
		}
	}
	return slotv1.Claim{}, false
}

// wait queues the calling thread for an entry of quotaMilli and blocks
// until it is served. Unless a HOLD request for the quota is on its way
// already, it sends one, whose grant goes to the first thread waiting for
// the quota and whose refusal to this thread. When ctx ends first the
// thread leaves the queue, or gives back the entry it was served meanwhile.
func (lc *local) wait(ctx context.Context, tid int, quotaMilli uint32) served {
	w := &waiter{tid: tid, quota: quotaMilli, got: make(chan served, 1)}
	lc.qmu.Lock()
	lc.queue = append(lc.queue, w)
	lc.waiting.Add(1)
	lc.serveLocked()
	ask := lc.queuedLocked(w) && !lc.asking[quotaMilli]
	if ask {
		lc.asking[quotaMilli] = true
		lc.asks.Add(1)
	}
	lc.qmu.Unlock()
	if ask {
		go func() {
			defer lc.asks.Done()
			lc.ask(w)
		}()
	}
	select {
	case s := <-w.got:
		return s
	case <-ctx.Done():
	}
	lc.qmu.Lock()
	if k := slices.Index(lc.queue, w); k >= 0 {
		lc.dequeueLocked(k)
		lc.qmu.Unlock()
		return served{err: ctx.Err()}
	}
	lc.qmu.Unlock()
	if s := <-w.got; s.err == nil { // served as ctx ended: sent at once
		lc.t.Release(s.cl, monotonicNow())
		lc.serveWaiters()
	}
	return served{err: ctx.Err()}
}

// serveWaiters hands free entries to waiting threads; one atomic load when
// none waits (the release path).
func (lc *local) serveWaiters() {
	if lc.waiting.Load() == 0 {
		return
	}
	lc.qmu.Lock()
	lc.serveLocked()
	lc.qmu.Unlock()
}

// serveLocked claims free entries of the process's own for waiting
// threads, first come first served (an entry of another process sharing
// the table has no fds here). The caller holds qmu.
func (lc *local) serveLocked() {
	for k := 0; k < len(lc.queue); {
		w := lc.queue[k]
		if cl, ok := lc.claimOwn(w.tid, w.quota); ok {
			lc.dequeueLocked(k)
			w.got <- served{cl: cl}
			continue
		}
		k++
	}
}

func (lc *local) dequeueLocked(k int) {
	lc.queue = append(lc.queue[:k], lc.queue[k+1:]...)
	lc.waiting.Add(-1)
}

func (lc *local) queuedLocked(w *waiter) bool {
	for _, q := range lc.queue {
		if q == w {
			return true
		}
	}
	return false
}

// firstLocked removes and returns the first thread waiting for quota (nil:
// none). The caller holds qmu.
func (lc *local) firstLocked(quota uint32) *waiter {
	for k, w := range lc.queue {
		if w.quota == quota {
			lc.dequeueLocked(k)
			return w
		}
	}
	return nil
}

// ask sends HOLD requests for asker's quota until no thread waits for it:
// a grant is published, claimed for the first thread waiting for the quota
// (free if none waits any more); a refusal goes to the thread the request
// was sent for, if it still waits (the others wait on, for entries and the
// next request).
func (lc *local) ask(asker *waiter) {
	quota := asker.quota
	for {
		ok, stale, err := lc.miss(quota)
		lc.qmu.Lock()
		var w *waiter
		var cl slotv1.Claim
		if err == nil {
			var holder uint32
			if w = lc.firstLocked(quota); w != nil {
				holder = uint32(w.tid)
			}
			if cl, err = lc.publish(ok, quota, holder); err != nil && w == nil && lc.queuedLocked(asker) {
				// Nobody to give the error to but the asker.
				w = asker
				lc.dequeueLocked(slices.Index(lc.queue, asker))
			}
		} else if lc.queuedLocked(asker) {
			w = asker
			lc.dequeueLocked(slices.Index(lc.queue, asker))
		}
		lc.qmu.Unlock()
		if err == nil && stale {
			// A reconnect re-declared held entries while this grant was on
			// its way: declare it too (it is the old agent's lease).
			lc.reclaim(cl.Index)
		}
		if w != nil {
			if err != nil {
				w.got <- served{err: err}
			} else {
				w.got <- served{cl: cl, ok: ok}
			}
		}
		lc.qmu.Lock()
		lc.serveLocked()
		next := -1
		for k, q := range lc.queue {
			if q.quota == quota {
				next = k
				break
			}
		}
		if next < 0 {
			delete(lc.asking, quota)
			lc.qmu.Unlock()
			return
		}
		asker = lc.queue[next]
		lc.qmu.Unlock()
	}
}

// errNotUsable means a claimed entry could not be used (its slot has no fds
// here, or placement failed); the entry was given back.
var errNotUsable = errors.New("entry not usable")

// use places the thread in claimed entry cl's slot unless it sits there,
// and starts the invocation's usage.
// last is the entry the thread used last (-1: none).
func (lc *local) use(tid int, cl slotv1.Claim, cur uint32, last int, action string, outcome slotv1.Outcome) (*Lease, error) {
	c, t := lc.c, lc.t
	e := t.Entry(cl.Index)
	c.mu.Lock()
	place, stat := c.splitLocked(c.fds[e.Slot])
	c.mu.Unlock()
	if len(place) == 0 {
		// A slot this process holds no fds for (another process's entry,
		// or a scribbled slot id): GONE for this process.
		t.Release(cl, e.IdleSince)
		return nil, errNotUsable
	}
	l := &Lease{c: c, Local: true, claim: cl, Slot: e.Slot, QuotaMilli: e.QuotaMilli, Outcome: outcome, Place: slotv1.PlaceNone,
		Degraded: e.Flags&slotv1.EntryDegraded != 0, tid: tid, action: action, stat: stat}
	if cur != e.Slot {
		if err := placeSelf(place); err != nil {
			// The slot is gone (or the entry lies): never claim it again.
			t.MarkGone(cl.Index)
			t.Release(cl, e.IdleSince)
			c.setCurrent(tid, 0)
			return nil, errNotUsable
		}
		l.Place = slotv1.PlaceSelf
		if outcome == slotv1.OutcomeAffinityHit {
			l.Outcome = slotv1.OutcomeCacheHit
		}
	}
	if cur != e.Slot || last != cl.Index {
		c.mu.Lock()
		c.current[tid] = e.Slot
		c.lastEntry[tid] = cl.Index
		c.mu.Unlock()
	}
	l.start, l.hasStart = readCounters(stat)
	return l, nil
}

// miss asks the agent for a HOLD lease of quotaMilli. stale: a reconnect
// happened while it was on its way.
func (lc *local) miss(quotaMilli uint32) (ok *slotv1.AcquireOK, stale bool, err error) {
	c := lc.c
	req := &slotv1.Acquire{QuotaMilli: quotaMilli, Flags: slotv1.AcquireHold, WaitUS: uint32(min(c.opts.Wait.Microseconds(), 1<<32-1))}
	// Idle held slots hold budget: give back what the new one would not
	// fit beside (the budget HELLO_OK announced), and if the agent still
	// refuses for budget, whatever is free.
	resp, fds, cn, err := lc.hold(lc.makeRoom(quotaMilli, false), req)
	if errors.Is(err, &slotv1.Error{Code: slotv1.CodeRejected}) || errors.Is(err, &slotv1.Error{Code: slotv1.CodeTimeout}) {
		if rel := lc.makeRoom(quotaMilli, true); len(rel) > 0 {
			resp, fds, cn, err = lc.hold(rel, req)
		}
	}
	if err != nil {
		return nil, false, err
	}
	ok, err = c.grant(resp, fds, func(*slotv1.AcquireOK) { stale = cn != lc.conn() })
	return ok, stale, err
}

// publish writes a granted HOLD lease (asked for quotaMilli) into the
// table, claimed by holder (0: free). On a full table the lease goes back.
func (lc *local) publish(ok *slotv1.AcquireOK, quotaMilli, holder uint32) (slotv1.Claim, error) {
	var flags uint32
	if ok.Flags&slotv1.AcquiredDegraded != 0 {
		flags |= slotv1.EntryDegraded
	}
	lc.mu.Lock()
	if lc.closed {
		lc.mu.Unlock()
		lc.sendRelease(ok.Lease)
		return slotv1.Claim{}, ErrClosed
	}
	cl, err := lc.t.Publish(slotv1.Entry{Slot: ok.Slot, QuotaMilli: ok.QuotaMilli, PeriodUS: ok.PeriodUS, Flags: flags, Lease: ok.Lease, AskedMilli: quotaMilli},
		holder, monotonicNow())
	var scribbled uint64
	if err == nil {
		if old := lc.own[cl.Index]; old != nil && !old.gone {
			// Our entry was scribbled empty: its lease is still ours.
			scribbled = old.lease
		}
		lc.own[cl.Index] = &ownEntry{slot: ok.Slot, quota: ok.QuotaMilli, lease: ok.Lease}
	}
	lc.mu.Unlock()
	if scribbled != 0 {
		lc.sendRelease(scribbled)
	}
	if err != nil {
		// The table is full: give the lease back (the thread leases for
		// itself).
		lc.sendRelease(ok.Lease)
	}
	return cl, err
}

// makeRoom empties free held entries, least recently used first, and
// returns their leases to release: until the process's held quota plus
// quotaMilli fits the container's announced budget, or (force) until they
// add up to quotaMilli.
func (lc *local) makeRoom(quotaMilli uint32, force bool) []uint64 {
	lc.c.mu.Lock()
	budget := uint64(lc.c.hello.BudgetMilli)
	lc.c.mu.Unlock()
	if budget == 0 && !force {
		return nil
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	held := uint64(quotaMilli)
	type cand struct {
		i    int
		idle uint64
	}
	var free []cand
	for i, o := range lc.own {
		if !o.gone {
			held += uint64(o.quota)
		}
		if e := lc.t.Entry(i); slotv1.Holder(e.State) == 0 {
			free = append(free, cand{i, e.IdleSince})
		}
	}
	sort.Slice(free, func(a, b int) bool { return free[a].idle < free[b].idle })
	var leases []uint64
	freed := uint64(0)
	for _, f := range free {
		if force && freed >= uint64(quotaMilli) || !force && held <= budget {
			break
		}
		cl, r := lc.t.Control(f.i)
		if r != slotv1.Claimed {
			continue
		}
		o := lc.own[f.i]
		lc.t.Clear(cl, f.idle)
		delete(lc.own, f.i)
		if !o.gone {
			leases = append(leases, o.lease)
			held -= uint64(o.quota)
			freed += uint64(o.quota)
		}
	}
	return leases
}

// hold sends the releases, then the HOLD request, on the hold connection,
// so that the agent frees the budget before it admits the new lease.
func (lc *local) hold(releases []uint64, req *slotv1.Acquire) (slotv1.Message, []int, *conn, error) {
	lc.cmu.Lock()
	defer lc.cmu.Unlock()
	for attempt := 0; ; attempt++ {
		cn, err := lc.holdConn()
		if err != nil {
			return nil, nil, nil, err
		}
		for _, id := range releases {
			if err = cn.sendBeside(&slotv1.Release{Lease: id, Outcome: slotv1.InvocationOK, Flags: slotv1.ReleaseNoReply}); err != nil {
				break
			}
		}
		if err == nil {
			var resp slotv1.Message
			var fds []int
			if resp, fds, err = cn.roundTrip(req); err == nil {
				if e, ok := resp.(*slotv1.Error); ok {
					closeFDs(fds)
					return nil, nil, cn, e
				}
				return resp, fds, cn, nil
			}
		}
		// The connection broke, and its leases ended with it (the
		// releases too): the next one re-declares what the table holds.
		cn.close()
		if attempt > 0 {
			return nil, nil, nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
		}
		releases = nil
	}
}

// conn is the hold connection (nil: none yet).
func (lc *local) conn() *conn {
	lc.cnMu.Lock()
	defer lc.cnMu.Unlock()
	return lc.cn
}

// holdConn returns the hold connection; when there is none, or the one
// there was closed (and its leases with it), it dials one and re-declares
// the held entries on it. The caller holds cmu.
func (lc *local) holdConn() (*conn, error) {
	if cn := lc.conn(); cn != nil && !cn.gone() {
		return cn, nil
	}
	cn, err := lc.c.dial(context.Background())
	if err != nil {
		return nil, err
	}
	lc.mu.Lock()
	err = lc.reclaimAllOn(cn)
	closed := lc.closed
	lc.mu.Unlock()
	if err == nil && closed {
		err = ErrClosed
	}
	if err != nil {
		cn.close()
		return nil, err
	}
	lc.cnMu.Lock()
	old := lc.cn
	lc.cn = cn
	lc.cnMu.Unlock()
	if old != nil {
		old.close()
	}
	return cn, nil
}

// recovered re-declares the held entries after a reconnect if the hold
// connection is gone (the agent restarted, or closed it).
func (lc *local) recovered() error {
	if cn := lc.conn(); cn == nil || !cn.gone() {
		return nil
	}
	lc.cmu.Lock()
	defer lc.cmu.Unlock()
	_, err := lc.holdConn()
	return err
}

// connGone reports whether the hold connection was closed.
func (lc *local) connGone() bool {
	cn := lc.conn()
	return cn != nil && cn.gone()
}

// stop ends run and waits until it has returned. Only Close calls it.
func (lc *local) stop() {
	lc.quitOnce.Do(func() { close(lc.quit) })
	<-lc.ran
}

// closeConn closes the hold connection: the agent releases what it still
// holds.
func (lc *local) closeConn() {
	lc.cnMu.Lock()
	cn := lc.cn
	lc.cn = nil
	lc.cnMu.Unlock()
	if cn != nil {
		cn.close()
	}
}

// leaseFrame sends m (SLEEP or WAKE) for local lease l's HOLD lease on the
// hold connection: as a request when none is in flight there, else
// one-way beside it (answer nil).
func (lc *local) leaseFrame(l *Lease, m *slotv1.Release) (slotv1.Message, error) {
	lc.mu.Lock()
	e := lc.own[l.claim.Index]
	if e == nil || e.gone || e.slot != l.Slot {
		lc.mu.Unlock()
		return nil, errors.New("cpuslot: the slot's HOLD lease is gone")
	}
	m.Lease = e.lease
	lc.mu.Unlock()
	cn := lc.conn()
	if cn == nil {
		return nil, ErrUnreachable
	}
	if !lc.cmu.TryLock() {
		one := *m
		one.Flags |= slotv1.ReleaseNoReply
		return nil, cn.sendBeside(&one)
	}
	defer lc.cmu.Unlock()
	return lc.c.exclusive(cn, m, func(*conn) {})
}

// release ends an invocation on a held slot: usage from the counters, then
// one store.
func (lc *local) release(l *Lease, outcome slotv1.ReleaseOutcome) (Usage, error) {
	if !l.released.CompareAndSwap(false, true) {
		// Another thread may hold the entry by now: touch nothing.
		return Usage{}, fmt.Errorf("%w twice", ErrReleased)
	}
	if l.sleeping.Load() {
		// The HOLD lease outlives this invocation: it must not stay lending
		// while the next one runs in its slot.
		_ = l.sendNap(slotv1.ReleaseWake)
	}
	var u Usage
	var err error
	if end, ok := readCounters(l.stat); ok && l.hasStart {
		d := end.Sub(l.start)
		u = usageOf(d)
		lc.add(l.action, outcome, d)
	} else {
		err = errors.New("cpuslot: slot counters unreadable; usage unknown")
	}
	lc.t.Release(l.claim, monotonicNow())
	lc.serveWaiters()
	return u, err
}

// add sums an invocation's usage into the next USAGE.
func (lc *local) add(action string, outcome slotv1.ReleaseOutcome, d counters.Usage) {
	if outcome > slotv1.InvocationTimeout {
		outcome = slotv1.InvocationFailed
	}
	k := usageKey{action, outcome}
	lc.usageMu.Lock()
	r := lc.usage[k]
	if r == nil {
		r = &slotv1.UsageRecord{Action: action, Outcome: outcome}
		lc.usage[k] = r
	}
	if r.Invocations < 1<<32-1 {
		r.Invocations++
	}
	r.CPUNanos += d.CPUNanos
	r.ThrottledNanos += d.ThrottledNanos
	full := len(lc.usage) >= slotv1.MaxUsageRecords
	lc.usageMu.Unlock()
	if full {
		select {
		case lc.kick <- struct{}{}:
		default:
		}
	}
}

// run sends USAGE (every second, or early with 8 keys pending) and drops
// idle and GONE entries, off the invocation path.
func (lc *local) run() {
	defer close(lc.ran)
	// Close ends a reconnect under way here (it waits for run).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-lc.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(usageEvery)
	defer tick.Stop()
	sweep := time.NewTicker(max(lc.idle/4, 10*time.Millisecond))
	defer sweep.Stop()
	for {
		select {
		case <-lc.c.stop:
			return
		case <-lc.quit:
			return
		case <-lc.kick:
			lc.flush()
		case <-tick.C:
			lc.flush()
			lc.c.checkAgent(ctx)
			lc.freeDead(monotonicNow())
			lc.serveWaiters()
			lc.held()
		case <-sweep.C:
			lc.dropIdle(monotonicNow())
		}
	}
}

// flush sends pending usage; what cannot be sent stays pending.
func (lc *local) flush() {
	lc.flushMu.Lock()
	defer lc.flushMu.Unlock()
	lc.usageMu.Lock()
	pending := lc.usage
	lc.usage = map[usageKey]*slotv1.UsageRecord{}
	lc.usageMu.Unlock()
	var recs []slotv1.UsageRecord
	for _, r := range pending {
		recs = append(recs, *r)
	}
	for len(recs) > 0 {
		n := min(len(recs), slotv1.MaxUsageRecords)
		if cn := lc.conn(); cn == nil || cn.sendBeside(&slotv1.Usage{Records: recs[:n]}) != nil {
			break
		}
		recs = recs[n:]
	}
	if len(recs) == 0 {
		return
	}
	lc.usageMu.Lock()
	for _, r := range recs {
		k := usageKey{r.Action, r.Outcome}
		if p := lc.usage[k]; p != nil {
			p.Invocations = uint32(min(uint64(p.Invocations)+uint64(r.Invocations), 1<<32-1))
			p.CPUNanos += r.CPUNanos
			p.ThrottledNanos += r.ThrottledNanos
		} else {
			r := r
			lc.usage[k] = &r
		}
	}
	lc.usageMu.Unlock()
}

// held asks the agent (HELD) what the process's HOLD leases are granted now
// and how much of them to give back, once a round of run while it holds
// slots: a CPU limit shrink can leave the container's leases above its new
// budget, and a busy held slot never idles long enough to be dropped. An
// agent that did not announce HELD is never asked.
func (lc *local) held() {
	c := lc.c
	if !c.heldOn.Load() {
		return
	}
	lc.mu.Lock()
	n := len(lc.own)
	lc.mu.Unlock()
	if n == 0 {
		return
	}
	cn := lc.conn()
	if cn == nil || !lc.cmu.TryLock() {
		return // a HOLD is on its way there: next round
	}
	resp, err := c.exclusive(cn, &slotv1.HeldRequest{}, func(*conn) {})
	lc.cmu.Unlock()
	if err != nil {
		return // refused for its rate, or the agent is away: next round
	}
	ok, isOK := resp.(*slotv1.HeldOK)
	if !isOK {
		return
	}
	c.mu.Lock()
	c.hello.BudgetMilli = ok.BudgetMilli // makeRoom fits misses within it
	c.mu.Unlock()
	if cn != lc.conn() {
		return // lease ids of a connection replaced meanwhile
	}
	lc.giveBack(ok)
	lc.dropIdle(monotonicNow())
}

// giveBack applies a HELD_OK: each own entry takes its lease's current
// grant, and entries adding up to give_back_m are given back, free ones
// at once (least recently used first), busy ones marked GONE so that no
// new claim takes them and dropped once their invocation released them.
func (lc *local) giveBack(ok *slotv1.HeldOK) {
	byLease := make(map[uint64]slotv1.HeldLease, len(ok.Leases))
	for _, l := range ok.Leases {
		byLease[l.Lease] = l
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	want := uint64(ok.GiveBackMilli)
	type cand struct {
		i    int
		busy bool
		idle uint64
	}
	var cands []cand
	for i, o := range lc.own {
		if o.gone {
			continue
		}
		e := lc.t.Entry(i)
		if l, found := byLease[o.lease]; found && l.Slot == o.slot && e.Slot == o.slot {
			o.quota = l.QuotaMilli
			lc.t.SetGranted(i, l.QuotaMilli, l.Flags&slotv1.HeldDegraded != 0)
		}
		if e.Flags&slotv1.EntryGone != 0 || e.Slot != o.slot {
			// Given back already, its invocation still running: counted.
			want -= min(want, uint64(o.quota))
			continue
		}
		cands = append(cands, cand{i, slotv1.Holder(e.State) != 0, e.IdleSince})
	}
	sort.Slice(cands, func(a, b int) bool {
		if cands[a].busy != cands[b].busy {
			return !cands[a].busy
		}
		return cands[a].idle < cands[b].idle
	})
	for _, cd := range cands {
		if want == 0 {
			return
		}
		o := lc.own[cd.i]
		if !cd.busy {
			dropped, claimed := lc.dropLocked(cd.i, o)
			if dropped {
				want -= min(want, uint64(o.quota))
				continue
			}
			if claimed {
				return // agent away: next round
			}
		}
		// In use (or claimed since): no new claim takes it; dropIdle gives
		// it back once its invocation released it.
		lc.t.MarkGone(cd.i)
		want -= min(want, uint64(o.quota))
	}
}

// freeDead frees the process's own entries claimed by a thread that no
// longer exists: a thread of a process sharing the table (SPEC.md: "A
// process's children may share it") or of this one that died in an
// invocation would otherwise hold the entry, and the held slot with it, for
// ever. A holder counts as dead only when the kernel says no thread has its
// TID (kill(tid, 0): ESRCH); a TID reused since by a live thread keeps the
// entry claimed (the safe side), and the compare-and-swap on the state
// word read before the check leaves alone an entry claimed anew meanwhile.
func (lc *local) freeDead(now uint64) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for i := range lc.own {
		s := lc.t.State(i)
		h := slotv1.Holder(s)
		if h == 0 || h == slotv1.HolderControl || h > 1<<22 {
			continue // free, ours to control, or no TID the kernel hands out (a scribble)
		}
		if unix.Kill(int(h), 0) == unix.ESRCH {
			lc.t.FreeDead(i, s, now)
		}
	}
}

// dropIdle gives back held slots no invocation used for the idle time, and
// entries the agent no longer backs.
func (lc *local) dropIdle(now uint64) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for i, o := range lc.own {
		e := lc.t.Entry(i)
		if slotv1.Holder(e.State) != 0 {
			continue
		}
		if o.gone || e.Slot != o.slot || e.Flags&slotv1.EntryGone != 0 || now-e.IdleSince >= uint64(lc.idle) {
			lc.dropLocked(i, o)
		}
	}
}

// dropLocked releases own entry i's lease (unless the agent refused it)
// and empties the entry, if it is free. claimed says whether it was free;
// dropped whether it is gone (not when the agent was away: try again
// later). The caller holds lc.mu.
func (lc *local) dropLocked(i int, o *ownEntry) (dropped, claimed bool) {
	cl, r := lc.t.Control(i)
	if r != slotv1.Claimed {
		return false, false
	}
	idle := lc.t.Entry(i).IdleSince
	if !o.gone && !lc.sendRelease(o.lease) {
		lc.t.Release(cl, idle) // agent away: try again later
		return false, true
	}
	lc.t.Clear(cl, idle)
	delete(lc.own, i)
	return true, true
}

func (lc *local) sendRelease(lease uint64) bool {
	cn := lc.conn()
	return cn != nil && cn.sendBeside(&slotv1.Release{Lease: lease, Outcome: slotv1.InvocationOK, Flags: slotv1.ReleaseNoReply}) == nil
}

// reclaimAllOn re-declares every held entry on cn, the new hold
// connection. The caller holds lc.mu.
func (lc *local) reclaimAllOn(cn *conn) error {
	for i := range lc.own {
		if err := lc.reclaimOn(cn, i); err != nil {
			return err
		}
	}
	// Refused entries no invocation holds go now; the others once free.
	for i, o := range lc.own {
		if o.gone && slotv1.Holder(lc.t.State(i)) == 0 {
			lc.dropLocked(i, o)
		}
	}
	return nil
}

func (lc *local) reclaim(i int) {
	lc.cmu.Lock()
	defer lc.cmu.Unlock()
	cn, err := lc.holdConn()
	if err != nil {
		return
	}
	lc.mu.Lock()
	err = lc.reclaimOn(cn, i)
	lc.mu.Unlock()
	if err != nil {
		cn.close()
	}
}

// reclaimOn sends RECLAIM (tid 0) for own entry i: the new lease id goes
// into the entry; a refusal marks it GONE. The caller holds lc.mu.
func (lc *local) reclaimOn(cn *conn, i int) error {
	o, ok := lc.own[i]
	if !ok {
		return nil
	}
	if o.gone {
		return nil
	}
	resp, fds, err := cn.roundTrip(&slotv1.Reclaim{Slot: o.slot, QuotaMilli: o.quota})
	if err != nil {
		return err
	}
	if ok, isOK := resp.(*slotv1.AcquireOK); isOK && ok.Slot == o.slot {
		o.lease = ok.Lease
		lc.t.SetLease(i, ok.Lease)
		lc.c.mu.Lock()
		lc.c.cacheFDs(ok.Slot, fds)
		lc.c.mu.Unlock()
		return nil
	}
	closeFDs(fds)
	o.gone = true
	lc.t.MarkGone(i)
	return nil
}

// close gives back every free held entry; entries invocations still hold
// are released by the agent when the connections close. The table stays
// mapped (a few KiB) for invocations still running.
func (lc *local) close() {
	lc.mu.Lock()
	lc.closed = true
	for i, o := range lc.own {
		if slotv1.Holder(lc.t.State(i)) == 0 {
			lc.dropLocked(i, o)
		}
	}
	lc.mu.Unlock()
}
