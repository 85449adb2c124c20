package pool

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/outcome"
)

func holdReq(owner Owner, q uint32) Request {
	return Request{Owner: owner, QuotaMilli: q, Hold: true}
}

// TestHoldLeases: a HOLD lease is the process's: the client places its
// threads itself, a thread's acquisition ends none, and releasing or
// abandoning it frees slot and budget.
func TestHoldLeases(t *testing.T) {
	b := newFake()
	p := start(t, cfg(Affinity, "250m=2"), b)
	ctx := context.Background()
	o := NewOwner()
	tl := must(t)(p.Acquire(ctx, req(o, 250, 1, 0)))
	h1 := must(t)(p.Acquire(ctx, holdReq(o, 250)))
	if h1.Place != PlaceSelf || h1.Outcome != outcome.CacheHit || h1.SlotID == tl.SlotID {
		t.Fatalf("first hold: %+v (thread's slot %d)", h1, tl.SlotID)
	}
	h2 := must(t)(p.Acquire(ctx, holdReq(o, 250)))
	if h2.Place != PlaceSelf || h2.Outcome != outcome.Created {
		t.Fatalf("second hold: %+v", h2)
	}
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprintf("[create %d 250m]", h2.SlotID) {
		t.Fatalf("a HOLD lease made cgroup writes other than its slot: %v", ops)
	}
	// The thread acquires again: its own lease is superseded, no HOLD lease.
	must(t)(p.Acquire(ctx, req(o, 250, 1, tl.SlotID)))
	if s := p.Summary(); s.Leases != 3 || s.UsedMilli != 750 {
		t.Fatalf("after a thread's acquisition: %+v", s)
	}
	if _, err := p.Release(o, h1.Lease, outcome.EndOK); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Release(o, h1.Lease, outcome.EndOK); !errors.Is(err, ErrUnknownLease) {
		t.Fatalf("double release: %v", err)
	}
	if _, err := p.Release(NewOwner(), h2.Lease, outcome.EndOK); !errors.Is(err, ErrUnknownLease) {
		t.Fatalf("another process released a HOLD lease: %v", err)
	}
	if n := p.ReleaseOwner(o); n != 2 {
		t.Fatalf("abandoned %d leases, want 2", n)
	}
	if s := p.Summary(); s.Leases != 0 || s.UsedMilli != 0 || len(p.holdCount) != 0 || len(p.threadLeases) != 0 {
		t.Fatalf("after the process left: %+v, holds %v", s, p.holdCount)
	}
}

// TestHoldRefusals: a HOLD request that names a thread, a current slot,
// an agent placement, an action or an invocation is a bad request, and so
// is any HOLD in a research baseline's pool.
func TestHoldRefusals(t *testing.T) {
	p := start(t, cfg(Affinity, "250m=1"), newFake())
	ctx := context.Background()
	o := NewOwner()
	for name, mut := range map[string]func(*Request){
		"tid":          func(r *Request) { r.Thread.TID = 7 },
		"current slot": func(r *Request) { r.CurrentSlot = 1 },
		"agent places": func(r *Request) { r.AgentPlaces = true },
		"action":       func(r *Request) { r.Action = "a" },
		"invocation":   func(r *Request) { r.Invocation = "i" },
	} {
		r := holdReq(o, 250)
		mut(&r)
		if _, err := p.Acquire(ctx, r); !errors.Is(err, ErrBadRequest) {
			t.Errorf("HOLD with %s: %v", name, err)
		}
	}
	for _, m := range []Mode{CacheLazy, CacheEager, Uncached} {
		bp := start(t, cfg(m, ""), newFake())
		if bp.GrantsHold() {
			t.Errorf("%s grants HOLD leases", m)
		}
		if _, err := bp.Acquire(ctx, holdReq(o, 250)); !errors.Is(err, ErrBadRequest) {
			t.Errorf("HOLD in %s: %v", m, err)
		}
		if _, err := bp.ReclaimHold(o, 1, 250); !errors.Is(err, ErrBadRequest) {
			t.Errorf("RECLAIM of a HOLD lease in %s: %v", m, err)
		}
	}
	if s := p.Summary(); s.Leases != 0 {
		t.Fatalf("%+v", s)
	}
}

// TestHoldBoundedByMaxSlots: a process holds at most maxSlots HOLD leases,
// even when a restart adopted more slots than that; the bound is refused
// at once (only the process itself can free one), and a reclaim beyond it
// is refused too.
func TestHoldBoundedByMaxSlots(t *testing.T) {
	b := newFake()
	b.adopt = map[uint32]cgroup.Spec{}
	c := cfg(Affinity, "")
	c.MaxSlots = 4
	for id := uint32(1); id <= 6; id++ {
		b.adopt[id] = cgroup.Spec{QuotaMilli: 250, PeriodUS: c.PeriodUS, Limit: c.Limit}
	}
	p := start(t, c, b)
	ctx := context.Background()
	o := NewOwner()
	held := map[uint32]bool{}
	for i := 0; i < 4; i++ {
		held[must(t)(p.Acquire(ctx, holdReq(o, 250))).SlotID] = true
	}
	if _, err := p.Acquire(ctx, holdReq(o, 250)); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("a fifth HOLD lease with maxSlots 4: %v", err)
	}
	var free uint32
	for id := uint32(1); id <= 6; id++ {
		if !held[id] {
			free = id
		}
	}
	if _, err := p.ReclaimHold(o, free, 250); !errors.Is(err, ErrRejected) {
		t.Fatalf("a reclaim beyond maxSlots HOLD leases: %v", err)
	}
	// Another process of the container may hold the rest.
	must(t)(p.Acquire(ctx, holdReq(NewOwner(), 250)))
}

// TestReclaimHold: a HOLD lease re-declared after a reconnect is again the
// process's: no thread, not superseded, counted under _hold.
func TestReclaimHold(t *testing.T) {
	p := start(t, cfg(Affinity, "250m=2"), newFake())
	ctx := context.Background()
	o := NewOwner()
	h := must(t)(p.Acquire(ctx, holdReq(o, 250)))
	p.ReleaseOwner(o)
	o2 := NewOwner()
	g := must(t)(p.ReclaimHold(o2, h.SlotID, 250))
	if g.Place != PlaceNone || g.SlotID != h.SlotID {
		t.Fatalf("%+v", g)
	}
	if _, err := p.ReclaimHold(NewOwner(), h.SlotID, 250); !errors.Is(err, ErrUnknownLease) {
		t.Fatalf("another process reclaimed a held slot: %v", err)
	}
	must(t)(p.Acquire(ctx, req(o2, 250, 1, 0))) // a thread's lease ends no HOLD lease
	if s := p.Summary(); s.Leases != 2 || p.holdCount[o2] != 1 {
		t.Fatalf("%+v holds %v", p.Summary(), p.holdCount)
	}
	if _, err := p.Release(o2, g.Lease, outcome.EndOK); err != nil {
		t.Fatal(err)
	}
	if len(p.holdCount) != 0 {
		t.Fatalf("holds %v", p.holdCount)
	}
}

// TestReportedActionsBounded: reports naming any number of actions keep at
// most maxActions names per container, and a client cannot feed the
// agent's own _hold series.
func TestReportedActionsBounded(t *testing.T) {
	c := cfg(Affinity, "")
	c.MaxActions = 5
	p := start(t, c, newFake())
	o := NewOwner()
	must(t)(p.Acquire(context.Background(), holdReq(o, 250))) // reports need a held slot
	for i := 0; i < 10000; i++ {
		p.Reported(o, []Report{{Action: fmt.Sprintf("a%d", i), How: outcome.EndOK, N: 1, CPUNanos: 1}})
	}
	if len(p.actions) != 5 {
		t.Fatalf("%d action names kept, want 5", len(p.actions))
	}
	// Records waiting for the next counter read are keyed by the capped
	// label too: at most the 5 names and _other.
	if n := len(p.creditOf(o).pending); n > 6 {
		t.Fatalf("%d records waiting after 10000 action names, want at most 6", n)
	}
	if l := p.actionLabel(outcome.HoldAction); l != "_other" {
		t.Fatalf("a client's %q is labelled %q", outcome.HoldAction, l)
	}
}

// TestReportedBoundedByHeldUsage: what a process reports in USAGE is cut
// to what its held slots used (read by the agent) and no earlier report
// claimed; a HOLD lease's release counts none of its CPU itself, and a
// process cannot spend another's credit.
func TestReportedBoundedByHeldUsage(t *testing.T) {
	b := newFake()
	p := start(t, cfg(Affinity, "250m=2"), b)
	ctx := context.Background()
	o, other := NewOwner(), NewOwner()
	h := must(t)(p.Acquire(ctx, holdReq(o, 250)))
	s := b.slots[h.SlotID]
	// Each report comes observeEvery after the one before, so each is
	// settled at once.
	now := time.Now()
	report := func(owner Owner, cpu uint64) (credited uint64) {
		now = now.Add(observeEvery)
		for _, r := range p.report(owner, []Report{{Action: "a", How: outcome.EndOK, N: 1, CPUNanos: cpu}}, now) {
			credited += r.CPUNanos
		}
		return credited
	}
	s.cpu += 300_000 // an invocation ran
	if got := report(o, 200_000); got != 200_000 {
		t.Fatalf("an honest report credited %d", got)
	}
	// Each counter read of the fake adds 1000 ns: about 100_000 are left.
	if got := report(o, 1_000_000); got < 100_000 || got > 110_000 {
		t.Fatalf("an overclaim credited %d, want what is left (about 100000)", got)
	}
	if got := report(o, 1_000_000); got > 10_000 {
		t.Fatalf("a repeated overclaim credited %d", got)
	}
	s.cpu += 500_000
	if got := report(other, 400_000); got != 0 {
		t.Fatalf("a process holding nothing was credited %d", got)
	}
	if _, err := p.Release(o, h.Lease, outcome.EndOK); err != nil {
		t.Fatal(err)
	}
	// Reported after the release: the slot's use up to it still counts.
	if got := report(o, 400_000); got != 400_000 {
		t.Fatalf("a report after the release credited %d", got)
	}
	p.ReleaseOwner(o)
	if len(p.credits) != 1 { // other's (empty) credit stays until it leaves
		t.Fatalf("credits left: %d", len(p.credits))
	}
}

// TestReportedInvocationsBoundedByHeldTime: the invocations a process
// reports are cut to one per minInvocation of slot time its HOLD leases
// held since; a process that holds nothing is credited none (and its
// records take no action name), and after a release the time held up to
// it still counts.
func TestReportedInvocationsBoundedByHeldTime(t *testing.T) {
	p := start(t, cfg(Affinity, "250m=2"), newFake())
	ctx := context.Background()
	o, other := NewOwner(), NewOwner()
	h := must(t)(p.Acquire(ctx, holdReq(o, 250)))
	granted := time.Now()
	now := granted
	count := func(owner Owner, n uint64) (credited uint64) {
		now = now.Add(observeEvery)
		for _, r := range p.report(owner, []Report{{Action: "a", How: outcome.EndOK, N: n}}, now) {
			credited += r.N
		}
		return credited
	}
	most := func() uint64 { return uint64(now.Sub(granted.Add(-time.Second)) / minInvocation) }
	if got := count(o, math.MaxUint64); got == 0 || got > most() {
		t.Fatalf("one slot held about %v: %d invocations credited, want 1..%d", observeEvery, got, most())
	}
	if got := count(o, 5); got != 5 {
		t.Fatalf("an honest count after an overclaim: %d credited, want 5", got)
	}
	if got := count(other, 1_000_000); got != 0 {
		t.Fatalf("a process holding nothing was credited %d invocations", got)
	}
	if len(p.actions) != 1 {
		t.Fatalf("action names kept: %v", p.actions)
	}
	if _, err := p.Release(o, h.Lease, outcome.EndOK); err != nil {
		t.Fatal(err)
	}
	// What the lease earned before its release and no report claimed
	// still counts.
	if got := count(o, 7); got != 7 {
		t.Fatalf("a report after the release: %d credited, want 7", got)
	}
}

// TestReportFloodReadsBounded: a process flooding USAGE frames costs the
// agent at most one read of each held slot's counters per observeEvery,
// not one per frame; the claims of frames in between wait and are counted
// at the next read, cut to what the slots used, none lost.
func TestReportFloodReadsBounded(t *testing.T) {
	b := newFake()
	c := cfg(Affinity, "250m=4")
	p := start(t, c, b)
	o := NewOwner()
	for range 4 {
		must(t)(p.Acquire(context.Background(), holdReq(o, 250)))
	}
	var reads atomic.Int64
	b.onIO = func(op string) {
		if op == "usage" {
			reads.Add(1)
		}
	}
	for _, s := range b.slots {
		s.cpu += 10_000_000 // 10 ms each, 40 ms held in all
	}
	now := time.Now()
	var counted uint64
	const frames = 10_000
	for i := range frames {
		// 10000 frames over 2.5 observeEvery: a flood.
		at := now.Add(time.Duration(i) * observeEvery / 4000)
		for _, r := range p.report(o, []Report{{Action: "a", How: outcome.EndOK, N: 1, CPUNanos: 1000}}, at) {
			counted += uint64(r.N)
		}
	}
	// The first frame reads; then one read per observeEvery (at 1 and 2).
	if got := reads.Load(); got > 3*4 {
		t.Fatalf("%d frames over 2.5 s read the held slots' counters %d times, want at most %d", frames, got, 3*4)
	}
	for _, r := range p.settle(o, now.Add(4*observeEvery)) {
		counted += uint64(r.N)
	}
	c2 := p.creditOf(o)
	if len(c2.pending) != 0 {
		t.Fatalf("claims still waiting after settleDue: %v", c2.pending)
	}
	if counted != frames {
		t.Fatalf("%d invocations counted of %d reported", counted, frames)
	}
	t.Logf("%d frames: %d counter reads", frames, reads.Load())
}

// TestReportWaitsForNextRead: a frame sent sooner than observeEvery after
// the last read is not cut against stale counters: it is counted in full
// at the next read, by a later report or by Reap.
func TestReportWaitsForNextRead(t *testing.T) {
	b := newFake()
	p := start(t, cfg(Affinity, "250m=1"), b)
	o := NewOwner()
	h := must(t)(p.Acquire(context.Background(), holdReq(o, 250)))
	s := b.slots[h.SlotID]
	// A millisecond after the acquisition: a lease held for no time at all
	// has earned no credit, and on a fast machine the clock may not move
	// between Acquire and here (the first report would be cut to nothing).
	now := time.Now().Add(time.Millisecond)
	if got := p.report(o, []Report{{Action: "a", How: outcome.EndOK, N: 1}}, now); len(got) != 1 {
		t.Fatalf("the first report: %v", got)
	}
	s.cpu += 500_000 // used after that read
	if got := p.report(o, []Report{{Action: "b", How: outcome.EndOK, N: 2, CPUNanos: 400_000}}, now.Add(observeEvery/10)); len(got) != 0 {
		t.Fatalf("a report within observeEvery was counted at once: %v", got)
	}
	got := p.report(o, []Report{{Action: "b", How: outcome.EndOK, N: 1, CPUNanos: 50_000}}, now.Add(observeEvery/5))
	if len(got) != 0 {
		t.Fatalf("a second early report was counted at once: %v", got)
	}
	p.Reap(now.Add(observeEvery))
	cr := p.creditOf(o)
	if len(cr.pending) != 0 {
		t.Fatalf("Reap left claims waiting: %v", cr.pending)
	}
	// Both early claims were counted in full: 450_000 of the 500_000 used.
	if cr.cpu < 50_000 || cr.cpu > 60_000 {
		t.Fatalf("credit left %d, want about 50000 (the early claims counted in full)", cr.cpu)
	}
}

// TestReportPendingSettledOnLeave: what a process claimed and the agent
// has not counted yet is counted when the process goes away.
func TestReportPendingSettledOnLeave(t *testing.T) {
	b := newFake()
	p := start(t, cfg(Affinity, "250m=1"), b)
	o := NewOwner()
	h := must(t)(p.Acquire(context.Background(), holdReq(o, 250)))
	now := time.Now()
	p.report(o, nil, now)
	b.slots[h.SlotID].cpu += 300_000
	p.report(o, []Report{{Action: "a", How: outcome.EndOK, N: 1, CPUNanos: 200_000}}, now.Add(time.Millisecond))
	var reads int
	b.onIO = func(op string) {
		if op == "usage" {
			reads++
		}
	}
	p.ReleaseOwner(o)
	// One read settles the waiting claim, one ends the lease.
	if reads != 2 {
		t.Fatalf("%d counter reads as the process left, want 2 (its waiting claims settled, then its lease ended)", reads)
	}
	if len(p.credits) != 0 {
		t.Fatalf("credits left: %d", len(p.credits))
	}
}

// TestReportHeldIsCountedWithoutAnotherFrame: a frame that came within
// observeEvery of the last read is counted once observeEvery has passed,
// by the pool itself, not only at the next frame or maintenance round
// (which left the agent's series up to a round behind the runtime's).
func TestReportHeldIsCountedWithoutAnotherFrame(t *testing.T) {
	b := newFake()
	p := start(t, cfg(Affinity, "250m=1"), b)
	o := NewOwner()
	h := must(t)(p.Acquire(context.Background(), holdReq(o, 250)))
	now := time.Now().Add(time.Millisecond)
	p.report(o, []Report{{Action: "a", How: outcome.EndOK, N: 1}}, now)
	b.slots[h.SlotID].cpu += 500_000
	if got := p.Reported(o, []Report{{Action: "b", How: outcome.EndOK, N: 1, CPUNanos: 100_000}}); len(got) != 0 {
		t.Fatalf("a report within observeEvery was counted at once: %v", got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		p.mu.Lock()
		left := len(p.creditOf(o).pending)
		p.mu.Unlock()
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the held record is still waiting 30 s later, with no frame and no Reap after it")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
