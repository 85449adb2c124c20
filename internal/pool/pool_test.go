package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/outcome"
	"github.com/cpuslot/cpuslot/internal/settings"
)

func TestAffinityReusesTheThreadsOwnSlot(t *testing.T) {
	b := newFake()
	p := start(t, cfg(Affinity, "250m=2,500m=1"), b)
	c := NewOwner()
	ctx := context.Background()

	g := must(t)(p.Acquire(ctx, req(c, 250, 1, 0)))
	if g.Outcome != outcome.CacheHit || g.Place != PlaceSelf {
		t.Fatalf("first acquisition: %+v", g)
	}
	if _, err := p.Release(c, g.Lease, outcome.EndOK); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		g2 := must(t)(p.Acquire(ctx, req(c, 250, 1, g.SlotID)))
		if g2.Outcome != outcome.AffinityHit || g2.Place != PlaceNone || g2.SlotID != g.SlotID {
			t.Fatalf("repeat %d: %+v", i, g2)
		}
		if _, err := p.Release(c, g2.Lease, outcome.EndOK); err != nil {
			t.Fatal(err)
		}
	}
	if ops := b.takeOps(); len(ops) != 0 {
		t.Fatalf("affinity hits wrote to cgroups: %v", ops)
	}
	// A thread that claims no current slot (a new thread reusing the TID)
	// is placed again, not trusted.
	g3 := must(t)(p.Acquire(ctx, req(c, 250, 1, 0)))
	if g3.Place != PlaceSelf {
		t.Fatalf("unknown current slot must be placed: %+v", g3)
	}
	// A second thread gets the other 250m slot, not the first thread's.
	g4 := must(t)(p.Acquire(ctx, req(c, 250, 2, 0)))
	if g4.SlotID == g3.SlotID {
		t.Fatal("two leases on one slot")
	}
}

func TestAffinityRetunesOwnSlotThenCreates(t *testing.T) {
	b := newFake()
	c := cfg(Affinity, "250m=1")
	c.MaxSlots = 2
	p := start(t, c, b)
	o := NewOwner()
	ctx := context.Background()
	g := must(t)(p.Acquire(ctx, req(o, 250, 1, 0)))
	p.Release(o, g.Lease, outcome.EndOK)
	// No free 700m slot: the thread's own free slot is retuned, no placement.
	g2 := must(t)(p.Acquire(ctx, req(o, 700, 1, g.SlotID)))
	if g2.Outcome != outcome.Retuned || g2.Place != PlaceNone || g2.Spec.QuotaMilli != 700 {
		t.Fatalf("%+v", g2)
	}
	// Another thread wants 700m while that slot is leased: a slot is created.
	g3 := must(t)(p.Acquire(ctx, req(o, 700, 2, 0)))
	if g3.Outcome != outcome.Created || g3.Place != PlaceSelf {
		t.Fatalf("%+v", g3)
	}
	// At the bound with every slot leased, a third waits and times out.
	_, err := p.Acquire(ctx, req(o, 250, 3, 0))
	if !errors.Is(err, ErrNoSlot) {
		t.Fatalf("want SLOT_UNAVAILABLE, got %v", err)
	}
	// ...unless a slot frees up while it waits.
	go func() { time.Sleep(10 * time.Millisecond); p.Release(o, g3.Lease, outcome.EndOK) }()
	r := req(o, 250, 3, 0)
	r.Wait = 2 * time.Second
	g4 := must(t)(p.Acquire(ctx, r))
	if !g4.Queued || g4.Outcome != outcome.Retuned {
		t.Fatalf("%+v", g4)
	}
}

func TestBaselineModesWriteTIDs(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()

	b := newFake()
	p := start(t, cfg(CacheEager, "250m=1"), b)
	g := must(t)(p.Acquire(ctx, req(o, 250, 1, 0)))
	p.Release(o, g.Lease, outcome.EndOK)
	g = must(t)(p.Acquire(ctx, req(o, 250, 1, g.SlotID)))
	p.Release(o, g.Lease, outcome.EndOK)
	want := []string{"place 1 10001", "moveout 10001", "place 1 10001", "moveout 10001"}
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprint(want) {
		t.Fatalf("eager: %v, want %v", ops, want)
	}

	b = newFake()
	p = start(t, cfg(CacheLazy, "250m=1"), b)
	g = must(t)(p.Acquire(ctx, req(o, 250, 1, 0)))
	p.Release(o, g.Lease, outcome.EndOK)
	g = must(t)(p.Acquire(ctx, req(o, 250, 1, 0)))
	if g.Place != PlaceNone {
		t.Fatalf("lazy same thread: %+v", g)
	}
	p.Release(o, g.Lease, outcome.EndOK)
	g = must(t)(p.Acquire(ctx, req(o, 250, 2, 0))) // another thread: evict, then place
	p.Release(o, g.Lease, outcome.EndOK)
	want = []string{"place 1 10001", "moveout 10001", "place 1 10002"}
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprint(want) {
		t.Fatalf("lazy: %v, want %v", ops, want)
	}

	b = newFake()
	p = start(t, cfg(Uncached, "250m=4"), b)
	if ops := b.takeOps(); len(ops) != 0 || len(b.slots) != 0 {
		t.Fatal("uncached must not pre-warm")
	}
	g = must(t)(p.Acquire(ctx, req(o, 250, 1, 0)))
	if g.Outcome != outcome.Created || g.Place != PlaceDone {
		t.Fatalf("%+v", g)
	}
	p.Release(o, g.Lease, outcome.EndOK)
	want = []string{"create 1 250m", "place 1 10001", "remove 1"}
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprint(want) {
		t.Fatalf("uncached: %v, want %v", ops, want)
	}
	if s := p.Summary(); len(s.Quotas) != 1 || s.Quotas[0].Slots != 0 {
		t.Fatalf("uncached left slots: %+v", s)
	}
}

func TestBadInput(t *testing.T) {
	b := newFake()
	b.limit = 1000
	p := start(t, cfg(Affinity, "250m=1"), b)
	o, other := NewOwner(), NewOwner()
	ctx := context.Background()
	for _, q := range []uint32{0, 5, 1500} {
		if _, err := p.Acquire(ctx, req(o, q, 1, 0)); !errors.Is(err, ErrInvalidQuota) {
			t.Errorf("quota %d: %v", q, err)
		}
	}
	g := must(t)(p.Acquire(ctx, req(o, 250, 1, 0)))
	if _, err := p.Release(other, g.Lease, outcome.EndOK); !errors.Is(err, ErrUnknownLease) {
		t.Fatalf("release by another connection: %v", err)
	}
	if _, err := p.Release(o, 999999, outcome.EndOK); !errors.Is(err, ErrUnknownLease) {
		t.Fatalf("unknown lease: %v", err)
	}
	u, err := p.Release(o, g.Lease, outcome.EndOK)
	if err != nil || u.CPUNanos == 0 {
		t.Fatalf("release: %+v %v", u, err)
	}
	if _, err := p.Release(o, g.Lease, outcome.EndOK); !errors.Is(err, ErrUnknownLease) {
		t.Fatalf("double release: %v", err)
	}
	if s := p.Summary(); s.UsedMilli != 0 || s.Leases != 0 {
		t.Fatalf("pool inconsistent after bad input: %+v", s)
	}
}

func TestCgroupRefusesMkdir(t *testing.T) {
	b := newFake()
	b.maxSlots = 1
	p := start(t, cfg(Affinity, "250m=1"), b)
	o := NewOwner()
	ctx := context.Background()
	g := must(t)(p.Acquire(ctx, req(o, 250, 1, 0)))
	_, err := p.Acquire(ctx, req(o, 500, 2, 0))
	if !errors.Is(err, ErrNoSlot) {
		t.Fatalf("want SLOT_UNAVAILABLE, got %v", err)
	}
	s := p.Summary()
	if s.Leases != 1 || s.UsedMilli != 250 || len(p.slots) != 1 {
		t.Fatalf("failed create left state behind: %+v, %d slots", s, len(p.slots))
	}
	p.Release(o, g.Lease, outcome.EndOK)
}

func TestAdmissionPolicies(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()
	mk := func(policy admission.Policy) (*Pool, *fakeBackend) {
		b := newFake()
		b.limit = 1000
		c := cfg(Affinity, "500m=2")
		c.Policy = policy
		return start(t, c, b), b
	}

	p, _ := mk(admission.Reject)
	g := must(t)(p.Acquire(ctx, req(o, 800, 1, 0)))
	if _, err := p.Acquire(ctx, req(o, 500, 2, 0)); !errors.Is(err, ErrRejected) {
		t.Fatalf("reject: %v", err)
	}
	p.Release(o, g.Lease, outcome.EndOK)

	p, _ = mk(admission.Queue)
	g = must(t)(p.Acquire(ctx, req(o, 800, 1, 0)))
	if _, err := p.Acquire(ctx, req(o, 500, 2, 0)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("queue timeout: %v", err)
	}
	go func() { time.Sleep(10 * time.Millisecond); p.Release(o, g.Lease, outcome.EndOK) }()
	r := req(o, 500, 2, 0)
	r.Wait = 2 * time.Second
	g2 := must(t)(p.Acquire(ctx, r))
	if !g2.Queued || g2.Spec.QuotaMilli != 500 {
		t.Fatalf("queued grant %+v", g2)
	}

	p, b := mk(admission.Degrade)
	g = must(t)(p.Acquire(ctx, req(o, 800, 1, 0)))
	g2 = must(t)(p.Acquire(ctx, req(o, 500, 2, 0)))
	if !g2.Degraded || g2.Spec.QuotaMilli != 200 {
		t.Fatalf("degraded grant %+v", g2)
	}
	b.takeOps()
	p.Release(o, g.Lease, outcome.EndOK)
	// The freed budget raises the degraded lease to what it asked for.
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprintf("[retune %d 500m]", g2.SlotID) {
		t.Fatalf("raise: %v", ops)
	}
	if s := p.Summary(); s.UsedMilli != 500 || s.Degraded != 0 {
		t.Fatalf("%+v", s)
	}
}

// TestFailedRaiseStaysDegraded: a raise whose retune fails gives the budget
// back and leaves the lease degraded at its old grant, first in line.
func TestFailedRaiseStaysDegraded(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()
	b := newFake()
	b.limit = 1000
	c := cfg(Affinity, "500m=1")
	c.Policy = admission.Degrade
	p := start(t, c, b)
	g := must(t)(p.Acquire(ctx, req(o, 800, 1, 0)))
	g2 := must(t)(p.Acquire(ctx, req(o, 500, 2, 0)))
	if !g2.Degraded || g2.Spec.QuotaMilli != 200 {
		t.Fatalf("degraded grant %+v", g2)
	}
	b.mu.Lock()
	b.failRetune = true
	b.mu.Unlock()
	p.Release(o, g.Lease, outcome.EndOK)
	if s := p.Summary(); s.UsedMilli != 200 || s.Degraded != 1 {
		t.Fatalf("after a failed raise: %+v, want 200m used and the lease still degraded", s)
	}
	p.mu.Lock()
	if l := p.leases[g2.Lease]; l.granted != 200 || l.slot.spec.QuotaMilli != 200 {
		t.Errorf("granted %dm, slot %dm, want 200m both", l.granted, l.slot.spec.QuotaMilli)
	}
	p.mu.Unlock()
}

func TestOwnerGoneAndReclaim(t *testing.T) {
	b := newFake()
	p := start(t, cfg(Affinity, "250m=2"), b)
	ctx := context.Background()
	o := NewOwner()
	g1 := must(t)(p.Acquire(ctx, req(o, 250, 1, 0)))
	must(t)(p.Acquire(ctx, req(o, 250, 2, 0)))
	if n := p.ReleaseOwner(o); n != 2 {
		t.Fatalf("released %d", n)
	}
	if s := p.Summary(); s.Leases != 0 || s.UsedMilli != 0 || s.Quotas[0].Free != 2 {
		t.Fatalf("%+v", s)
	}
	// A reconnecting client re-declares a lease it still runs under.
	o2 := NewOwner()
	g := must(t)(p.Reclaim(o2, g1.SlotID, 250, Thread{NS: 1, TID: 1}, "a"))
	if g.Place != PlaceNone {
		t.Fatalf("%+v", g)
	}
	if _, err := p.Reclaim(NewOwner(), g1.SlotID, 250, Thread{NS: 1, TID: 9}, "a"); !errors.Is(err, ErrUnknownLease) {
		t.Fatalf("double reclaim: %v", err)
	}
	// The same process re-declaring its own lease gets it under a new id.
	g2 := must(t)(p.Reclaim(o2, g1.SlotID, 250, Thread{NS: 1, TID: 1}, "a"))
	if g2.Lease == g.Lease || g2.SlotID != g.SlotID {
		t.Fatalf("re-reclaim: %+v after %+v", g2, g)
	}
	if _, err := p.Release(o2, g.Lease, outcome.EndOK); !errors.Is(err, ErrUnknownLease) {
		t.Fatalf("the old id must be void: %v", err)
	}
	g = g2
	if _, err := p.Reclaim(o2, 4242, 250, Thread{NS: 1, TID: 1}, "a"); !errors.Is(err, ErrUnknownLease) {
		t.Fatalf("unknown slot: %v", err)
	}
	if _, err := p.Release(o2, g.Lease, outcome.EndOK); err != nil {
		t.Fatal(err)
	}
}

func TestAdoptionAndReap(t *testing.T) {
	b := newFake()
	b.adopt = map[uint32]cgroup.Spec{
		3: {QuotaMilli: 250, PeriodUS: 100000, Limit: cgroup.LimitCap},
		9: {QuotaMilli: 250, PeriodUS: 50000, Limit: cgroup.LimitShare},
	}
	c := cfg(Affinity, "250m=1,1=1")
	c.IdleTimeout = time.Minute
	p, err := New("test", c, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	ops := b.takeOps()
	// Slot 9 had another period and limit: retuned; 1 core was missing: created with a fresh id.
	if fmt.Sprint(ops) != "[retune 9 250m create 10 1000m]" {
		t.Fatalf("start: %v", ops)
	}
	if n := p.Reap(time.Now()); n != 0 {
		t.Fatalf("reaped %d before the idle timeout", n)
	}
	if n := p.Reap(time.Now().Add(2 * time.Minute)); n != 1 {
		t.Fatalf("reaped %d, want the one extra 250m slot", n)
	}
	s := p.Summary()
	if len(s.Quotas) != 2 || s.Quotas[0].Slots != 1 || s.Quotas[1].Slots != 1 {
		t.Fatalf("%+v", s)
	}
	if err := p.Close(true); err != nil || !b.unprepared {
		t.Fatalf("close: %v released=%v", err, b.unprepared)
	}
	for _, fs := range b.slots {
		if !fs.removed {
			t.Fatalf("slot %d left after Close(true)", fs.id)
		}
	}
}

// TestSupersede: a thread that acquires again while holding a lease (its
// one-way release still in flight) ends the old lease first.
func TestSupersede(t *testing.T) {
	b := newFake()
	p := start(t, cfg(Affinity, "250m=1"), b)
	o := NewOwner()
	ctx := context.Background()
	g1 := must(t)(p.Acquire(ctx, req(o, 250, 1, 0)))
	g2 := must(t)(p.Acquire(ctx, req(o, 250, 1, g1.SlotID)))
	if g2.SlotID != g1.SlotID || g2.Outcome != outcome.AffinityHit {
		t.Fatalf("the thread's own slot should be reused: %+v", g2)
	}
	if _, err := p.Release(o, g1.Lease, outcome.EndOK); !errors.Is(err, ErrUnknownLease) {
		t.Fatalf("late release of the superseded lease: %v", err)
	}
	// Another process's thread with the same id is someone else.
	if _, err := p.Acquire(ctx, req(NewOwner(), 250, 1, g1.SlotID)); err != nil {
		t.Fatal(err)
	}
	if s := p.Summary(); s.Leases != 2 {
		t.Fatalf("%+v", s)
	}
}

// TestRemovalBusy: a slot whose removal fails (threads keep arriving) stays
// in the pool, usable, and the reaper tries again later.
func TestRemovalBusy(t *testing.T) {
	b := newFake()
	c := cfg(Affinity, "250m=1")
	c.IdleTimeout = time.Minute
	p := start(t, c, b)
	o := NewOwner()
	ctx := context.Background()
	g1 := must(t)(p.Acquire(ctx, req(o, 250, 1, 0)))
	g2 := must(t)(p.Acquire(ctx, req(o, 250, 2, 0))) // grown: an extra slot
	p.Release(o, g1.Lease, outcome.EndOK)
	p.Release(o, g2.Lease, outcome.EndOK)
	for _, fs := range b.slots {
		fs.busy = 1 // whichever slot the reaper picks is busy once
	}
	later := time.Now().Add(2 * time.Minute)
	if n := p.Reap(later); n != 1 {
		t.Fatalf("reap attempted %d", n)
	}
	if s := p.Summary(); s.Quotas[0].Slots != 2 || s.Quotas[0].Free != 2 {
		t.Fatalf("a slot that could not be removed must stay free: %+v", s)
	}
	must(t)(p.Acquire(ctx, req(o, 250, 3, 0)))
	p.ReleaseOwner(o)
	for _, fs := range b.slots {
		fs.busy = 0 // the threads are gone now
	}
	p.Reap(later)
	if s := p.Summary(); s.Quotas[0].Slots != 1 {
		t.Fatalf("second reap should remove it: %+v", s)
	}
}

// A container ending while its threads still enter its slots (the
// runtime places them itself): Close(true) cannot remove those slots; it
// keeps them, and the backend, for RemoveLeft, which removes them once the
// threads are gone and only then undoes the preparation.
func TestCloseLeavesBusySlotsForRemoveLeft(t *testing.T) {
	b := newFake()
	p := start(t, cfg(Affinity, "250m=2"), b)
	n := 0
	for _, fs := range b.slots {
		if n == 0 {
			fs.busy = 3 // Close and two more rounds find it busy
		}
		n++
	}
	err := p.Close(true)
	if !errors.Is(err, cgroup.ErrBusy) {
		t.Fatalf("Close(true) = %v, want ErrBusy", err)
	}
	if b.unprepared || b.closed {
		t.Fatalf("unprepared %v, backend closed %v with a slot left", b.unprepared, b.closed)
	}
	for round := 1; ; round++ {
		done, err := p.RemoveLeft(false)
		if !done {
			if !errors.Is(err, cgroup.ErrBusy) || b.unprepared || b.closed {
				t.Fatalf("round %d: %v; unprepared %v, closed %v", round, err, b.unprepared, b.closed)
			}
			continue
		}
		if err != nil || round != 3 {
			t.Fatalf("done at round %d: %v, want round 3 without error", round, err)
		}
		break
	}
	for id, fs := range b.slots {
		if !fs.removed {
			t.Errorf("slot %d not removed", id)
		}
	}
	if !b.unprepared || !b.closed {
		t.Errorf("after the last slot: unprepared %v, backend closed %v", b.unprepared, b.closed)
	}
}

// Given up (last): slots still busy are closed, with the backend, so a
// container that keeps entering them leaks no descriptor.
func TestRemoveLeftGivesUp(t *testing.T) {
	b := newFake()
	p := start(t, cfg(Affinity, "250m=1"), b)
	for _, fs := range b.slots {
		fs.busy = 100
	}
	if err := p.Close(true); !errors.Is(err, cgroup.ErrBusy) {
		t.Fatalf("Close(true) = %v, want ErrBusy", err)
	}
	done, err := p.RemoveLeft(true)
	if !done || !errors.Is(err, cgroup.ErrBusy) || !b.closed || b.unprepared {
		t.Fatalf("RemoveLeft(true) = %v, %v; backend closed %v, unprepared %v", done, err, b.closed, b.unprepared)
	}
	if done, err := p.RemoveLeft(false); !done || err != nil {
		t.Fatalf("after giving up, RemoveLeft = %v, %v, want nothing left", done, err)
	}
}

func TestConcurrentAcquireRelease(t *testing.T) {
	b := newFake()
	c := cfg(Affinity, "250m=4,500m=2")
	c.MaxSlots = 8
	c.DefaultWait = 2 * time.Second
	p := start(t, c, b)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			o := NewOwner()
			cur := uint32(0)
			for i := 0; i < 200; i++ {
				q := uint32(250 * (1 + (w+i)%2))
				g, err := p.Acquire(context.Background(), req(o, q, uint32(w+1), cur))
				if err != nil {
					t.Error(err)
					return
				}
				cur = g.SlotID
				if _, err := p.Release(o, g.Lease, outcome.EndOK); err != nil {
					t.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	s := p.Summary()
	if s.Leases != 0 || s.UsedMilli != 0 {
		t.Fatalf("%+v", s)
	}
	n := 0
	for _, q := range s.Quotas {
		n += q.Slots
		if q.Free != q.Slots {
			t.Fatalf("%+v", s)
		}
	}
	if n > 8 {
		t.Fatalf("%d slots above the bound", n)
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]uint32{"250m": 250, "1": 1000, "1.5": 1500, "0.25": 250, "2000m": 2000} {
		if got, err := ParseQuota(in); err != nil || got != want {
			t.Errorf("%s: %d %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "0", "-1", "-250m", "abc", "1e3", "0.0001", "NaN", "Inf", "250mm", "m", "1.5m"} {
		if _, err := ParseQuota(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	p, err := ParsePrewarm("250m=8, 500m=4,1=2")
	if err != nil || FormatPrewarm(p) != "250m=8,500m=4,1=2" {
		t.Fatalf("%v %v", p, err)
	}
	for _, bad := range []string{"250m", "250m=-1", "250m=x", "x=1", "250m=1,0.25=2"} {
		if _, err := ParsePrewarm(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := settings.ParseMode("affinity"); err != nil {
		t.Fatal(err)
	}
	if _, err := settings.ParseMode("fast"); err == nil {
		t.Fatal("accepted unknown mode")
	}
	c := settings.Default()
	c.Prewarm = map[uint32]int{250: 100}
	if c.Validate() == nil {
		t.Fatal("prewarm above maxSlots accepted")
	}
}

// TestNoCgroupIOUnderThePoolLock: no mode does cgroup I/O while holding the
// pool's lock (a slow cgroup write would stall every acquisition of the
// container), raising a degraded lease included.
func TestNoCgroupIOUnderThePoolLock(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []Mode{Affinity, CacheLazy, CacheEager, Uncached} {
		t.Run(string(mode), func(t *testing.T) {
			b := newFake()
			b.limit = 1000
			c := cfg(mode, "500m=2")
			c.Policy = admission.Degrade
			p, err := New("test", c, b, nil)
			if err != nil {
				t.Fatal(err)
			}
			var under []string
			// The test runs on one goroutine: the lock held during an
			// operation is held by the operation's caller.
			b.onIO = func(op string) {
				if !p.mu.TryLock() {
					under = append(under, op)
					return
				}
				p.mu.Unlock()
			}
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			o := NewOwner()
			g1 := must(t)(p.Acquire(ctx, req(o, 800, 1, 0)))
			g2 := must(t)(p.Acquire(ctx, req(o, 500, 2, 0)))
			if !g2.Degraded {
				t.Fatalf("not degraded: %+v", g2)
			}
			p.Release(o, g1.Lease, outcome.EndOK) // raises g2
			if s := p.Summary(); s.UsedMilli != 500 || s.Degraded != 0 {
				t.Fatalf("degraded lease not raised: %+v", s)
			}
			g3 := must(t)(p.Acquire(ctx, req(o, 300, 2, g2.SlotID))) // supersedes g2
			p.Release(o, g3.Lease, outcome.EndPlacementFailed)
			p.Reap(time.Now().Add(time.Hour))
			if err := p.Close(true); err != nil {
				t.Fatal(err)
			}
			if len(under) > 0 {
				t.Fatalf("cgroup operations under the pool lock: %v", under)
			}
		})
	}
}
