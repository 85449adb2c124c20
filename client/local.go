package client

// Local leasing (SPEC.md, "Local leasing"): the process holds slots as HOLD
// leases, keeps them in a slot table, and its threads claim them with a
// compare-and-swap. An invocation then costs one write when the thread must
// move, nothing when it sits in the slot already, and a round trip to the
// agent only on a miss. Per-invocation usage travels later, summed, in
// one-way USAGE messages.

import (
	"errors"
	"fmt"
	"os"
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
	// onWay is the quota of grants the agent has answered and the table
	// does not hold yet (between hold and publish): held all the same.
	onWay uint64
	// afterGrant, set by tests only, runs between a grant's answer and
	// its publish.
	afterGrant func(quotaMilli uint32)
	// closed: Close has dropped the free entries; a grant published after
	// that goes straight back.
	closed bool

	// qmu guards queue, asking and grantedAt: the threads waiting for an
	// entry, in arrival order, the quotas a HOLD request is on its way for
	// (one at a time per quota), and when the agent last granted one of
	// each quota. waiting counts queue: the fast path reads it alone.
	qmu       sync.Mutex
	queue     []*waiter
	asking    map[uint32]bool
	grantedAt map[uint32]time.Time
	waiting   atomic.Int32
	// asks counts HOLD requests on their way: Close waits for their
	// grants, which no waiter may take any more, to give them back.
	asks sync.WaitGroup

	// cn is the connection the process's HOLD leases are granted on; they
	// are released, slept, woken, listed (HOLD_LIST) and reported (USAGE) there
	// only (SPEC.md, "Lifetimes"). cmu: one request at a time on it (a
	// HOLD, HOLD_LIST, RECLAIM); one-way frames go beside (sendBeside), so none
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

type usageKey struct {
	action  string
	outcome slotv1.ReleaseOutcome
}

func newLocal(c *Client) (*local, error) {
	lc := &local{c: c, idle: c.opts.LocalIdle, own: map[int]*ownEntry{}, usage: map[usageKey]*slotv1.UsageRecord{}, kick: make(chan struct{}, 1),
		asking: map[uint32]bool{}, grantedAt: map[uint32]time.Time{}}
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

// stop ends run and waits until it has returned. Only Close calls it.
func (lc *local) stop() {
	lc.quitOnce.Do(func() { close(lc.quit) })
	<-lc.ran
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
		_ = l.sendSleepOrWake(slotv1.ReleaseWake)
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
