package pool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/outcome"
	"github.com/prometheus/client_golang/prometheus"
)

// lendPool is a pool of a 1000m container with lending at ratio and
// admission policy pol.
func lendPool(t *testing.T, ratio float64, pol admission.Policy) (*Pool, *fakeBackend) {
	t.Helper()
	b := newFake()
	b.limit = 1000
	c := cfg(Affinity, "500m=2")
	c.Policy = pol
	c.LendRatio = ratio
	return start(t, c, b), b
}

// checkBound: what the pool charges never exceeds the budget, and the quota
// granted beyond it is at most what sleepers lend.
func checkBound(t *testing.T, p *Pool) {
	t.Helper()
	s := p.Summary()
	var granted, sleeping, lending uint64
	p.mu.Lock()
	for _, l := range p.leases {
		granted += uint64(l.granted)
		if l.sleeping {
			sleeping += uint64(l.granted)
		}
		if l.lent > 0 {
			lending++
		}
	}
	p.mu.Unlock()
	if s.Lends-s.GiveBacks != lending {
		t.Fatalf("%d lends - %d give-backs, but %d leases lend", s.Lends, s.GiveBacks, lending)
	}
	if s.UsedMilli > s.BudgetMilli {
		t.Fatalf("charged %dm above the budget of %dm", s.UsedMilli, s.BudgetMilli)
	}
	if granted != uint64(s.UsedMilli)+uint64(s.LentMilli) {
		t.Fatalf("granted %dm, charged %dm + lent %dm", granted, s.UsedMilli, s.LentMilli)
	}
	if float64(s.LentMilli) > p.cfg.LendRatio*float64(sleeping) {
		t.Fatalf("lent %dm, more than %v of the sleepers' %dm", s.LentMilli, p.cfg.LendRatio, sleeping)
	}
}

// TestLendOnSleep: a sleeping lease lends lendRatio of its quota; a new
// acquisition is admitted into it; the sleeper keeps its slot's quota.
func TestLendOnSleep(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()
	p, b := lendPool(t, 0.5, admission.Reject)
	g1 := must(t)(p.Acquire(ctx, req(o, 500, 1, 0)))
	g2 := must(t)(p.Acquire(ctx, req(o, 500, 2, 0)))
	if _, err := p.Acquire(ctx, req(o, 250, 3, 0)); !errors.Is(err, ErrRejected) {
		t.Fatalf("full budget: %v", err)
	}
	b.takeOps()
	if err := p.Sleep(o, g1.Lease); err != nil {
		t.Fatal(err)
	}
	if ops := b.takeOps(); len(ops) != 0 {
		t.Fatalf("a sleep writes no cgroup file: %v", ops)
	}
	if s := p.Summary(); s.LentMilli != 250 || s.UsedMilli != 750 {
		t.Fatalf("after sleep: %+v", s)
	}
	g3 := must(t)(p.Acquire(ctx, req(o, 250, 3, 0)))
	if g3.Degraded || g3.Spec.QuotaMilli != 250 {
		t.Fatalf("borrower %+v", g3)
	}
	checkBound(t, p)
	// Only lendRatio is lent: nothing more fits.
	if _, err := p.Acquire(ctx, req(o, 50, 4, 0)); !errors.Is(err, ErrRejected) {
		t.Fatalf("beyond the ratio: %v", err)
	}
	// A second SLEEP lends nothing more.
	if err := p.Sleep(o, g1.Lease); err != nil {
		t.Fatal(err)
	}
	if s := p.Summary(); s.LentMilli != 250 {
		t.Fatalf("slept twice: %+v", s)
	}
	checkBound(t, p)
	_ = g2
}

// TestWakeTakesBackFromBorrowers: on WAKE the sleeper is charged its whole
// quota at once (its slot was never lowered) and the pool degrades the
// youngest awake leases, never the waker, to fit the budget again; releases
// raise them back.
func TestWakeTakesBackFromBorrowers(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()
	p, b := lendPool(t, 0.5, admission.Queue)
	reg := prometheus.NewRegistry()
	p.metrics = metrics.New(reg)
	g1 := must(t)(p.Acquire(ctx, req(o, 500, 1, 0)))
	g2 := must(t)(p.Acquire(ctx, req(o, 500, 2, 0)))
	must(t)(nil, p.Sleep(o, g1.Lease))
	g3 := must(t)(p.Acquire(ctx, req(o, 250, 3, 0)))
	b.takeOps()
	if err := p.Wake(o, g1.Lease); err != nil {
		t.Fatal(err)
	}
	// 250m over: the borrower goes down to the minimum (200m), the next
	// youngest by the rest.
	ops := b.takeOps()
	if fmt.Sprint(ops) != fmt.Sprintf("[retune %d 50m retune %d 450m]", g3.SlotID, g2.SlotID) {
		t.Fatalf("wake should cut the youngest leases: %v", ops)
	}
	s := p.Summary()
	if s.LentMilli != 0 || s.Degraded != 2 || s.Wakes != 1 || s.UsedMilli != 1000 ||
		s.Lends != 1 || s.GiveBacks != 1 || s.Cuts != 2 {
		t.Fatalf("after wake: %+v", s)
	}
	if n := wakesObserved(t, reg); n != 1 {
		t.Fatalf("wake-to-quota observed %d wakes, want 1", n)
	}
	checkBound(t, p)
	p.mu.Lock()
	if l := p.leases[g1.Lease]; l.granted != 500 || l.slot.spec.QuotaMilli != 500 {
		t.Fatalf("the waker has %dm, its slot %dm", l.granted, l.slot.spec.QuotaMilli)
	}
	p.mu.Unlock()
	// A release raises the borrower back.
	p.Release(o, g2.Lease, outcome.EndOK)
	_ = g2
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprintf("[retune %d 250m]", g3.SlotID) {
		t.Fatalf("raise after release: %v", ops)
	}
	if s := p.Summary(); s.UsedMilli != 750 || s.Degraded != 0 {
		t.Fatalf("after release: %+v", s)
	}
	// WAKE of an awake lease does nothing.
	must(t)(nil, p.Wake(o, g1.Lease))
	if s := p.Summary(); s.Wakes != 1 || s.UsedMilli != 750 || s.GiveBacks != 1 {
		t.Fatalf("wake of an awake lease: %+v", s)
	}
	if n := wakesObserved(t, reg); n != 1 {
		t.Fatalf("wake-to-quota observed %d wakes, want 1 (an awake lease's WAKE is none)", n)
	}
}

// wakesObserved is the count of cpuslot_wake_to_quota_seconds in reg.
func wakesObserved(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "cpuslot_wake_to_quota_seconds" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("no cpuslot_wake_to_quota_seconds")
	return 0
}

// TestWakeCutsOnlyWhatIsNeeded: a borrower is cut by the excess, not to the
// minimum, and the waker itself is never cut.
func TestWakeCutsOnlyWhatIsNeeded(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()
	p, b := lendPool(t, 1, admission.Queue)
	g1 := must(t)(p.Acquire(ctx, req(o, 500, 1, 0)))
	must(t)(nil, p.Sleep(o, g1.Lease))
	g2 := must(t)(p.Acquire(ctx, req(o, 1000, 2, 0)))
	b.takeOps()
	must(t)(nil, p.Wake(o, g1.Lease))
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprintf("[retune %d 500m]", g2.SlotID) {
		t.Fatalf("cut: %v", ops)
	}
	if s := p.Summary(); s.UsedMilli != 1000 || s.Degraded != 1 {
		t.Fatalf("%+v", s)
	}
	checkBound(t, p)
}

// TestReleaseWhileSleeping: a sleeping lease's release gives back only what
// it was charged.
func TestReleaseWhileSleeping(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()
	p, _ := lendPool(t, 0.5, admission.Queue)
	g1 := must(t)(p.Acquire(ctx, req(o, 500, 1, 0)))
	must(t)(nil, p.Sleep(o, g1.Lease))
	g2 := must(t)(p.Acquire(ctx, req(o, 750, 2, 0)))
	p.Release(o, g1.Lease, outcome.EndOK)
	if s := p.Summary(); s.UsedMilli != 750 || s.LentMilli != 0 || s.Lends != 1 || s.GiveBacks != 1 || s.Wakes != 0 {
		t.Fatalf("after the sleeper's release: %+v", s)
	}
	p.Release(o, g2.Lease, outcome.EndOK)
	if s := p.Summary(); s.UsedMilli != 0 {
		t.Fatalf("all released: %+v", s)
	}
}

// TestLendingOff: with lendRatio 0 a SLEEP lends nothing.
func TestLendingOff(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()
	p, _ := lendPool(t, 0, admission.Reject)
	g1 := must(t)(p.Acquire(ctx, req(o, 1000, 1, 0)))
	must(t)(nil, p.Sleep(o, g1.Lease))
	if _, err := p.Acquire(ctx, req(o, 50, 2, 0)); !errors.Is(err, ErrRejected) {
		t.Fatalf("lending off: %v", err)
	}
	must(t)(nil, p.Wake(o, g1.Lease))
	if s := p.Summary(); s.LentMilli != 0 || s.UsedMilli != 1000 {
		t.Fatalf("%+v", s)
	}
}

// TestSleepRefusesOthersLeases: a connection can sleep or wake only its own
// leases.
func TestSleepRefusesOthersLeases(t *testing.T) {
	ctx := context.Background()
	o, other := NewOwner(), NewOwner()
	p, _ := lendPool(t, 0.5, admission.Reject)
	g := must(t)(p.Acquire(ctx, req(o, 500, 1, 0)))
	for name, f := range map[string]func(Owner, uint64) error{"sleep": p.Sleep, "wake": p.Wake} {
		if err := f(other, g.Lease); !errors.Is(err, ErrUnknownLease) {
			t.Errorf("%s of another's lease: %v", name, err)
		}
		if err := f(o, g.Lease+1000); !errors.Is(err, ErrUnknownLease) {
			t.Errorf("%s of an unknown lease: %v", name, err)
		}
	}
	if s := p.Summary(); s.LentMilli != 0 {
		t.Fatalf("%+v", s)
	}
}

// TestLyingRuntimeStaysInBudget: a runtime that says every lease sleeps,
// fills what they lend, wakes them all and sleeps them again can never be
// charged beyond the budget while lending, and lends at most lendRatio of
// its sleepers' quota; once all are awake, the borrowers are cut back.
func TestLyingRuntimeStaysInBudget(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()
	p, _ := lendPool(t, 0.75, admission.Degrade)
	var ids []uint64
	tid := uint32(1)
	acquire := func() bool {
		r := req(o, 250, tid, 0)
		r.Wait = 1 // no waiting: admit now or not
		g, err := p.Acquire(ctx, r)
		tid++
		if err != nil {
			return false
		}
		ids = append(ids, g.Lease)
		return true
	}
	for round := 0; round < 4; round++ {
		for acquire() && len(ids) < 60 {
		}
		checkBound(t, p)
		for _, id := range ids {
			must(t)(nil, p.Sleep(o, id))
			checkBound(t, p)
		}
		for acquire() && len(ids) < 60 {
		}
		checkBound(t, p)
		for _, id := range ids {
			must(t)(nil, p.Wake(o, id))
		}
		// All awake: nothing is lent, and what is charged above the budget
		// is only what the minimum grant leaves (the borrowers were cut).
		s := p.Summary()
		if s.LentMilli != 0 {
			t.Fatalf("round %d: lent %dm with none asleep", round, s.LentMilli)
		}
		if over := int(s.UsedMilli) - int(s.BudgetMilli); over > len(ids)*int(p.cfg.MinDegradedMilli) {
			t.Fatalf("round %d: %dm over the budget with %d leases", round, over, len(ids))
		}
	}
	for _, id := range ids {
		p.Release(o, id, outcome.EndOK)
	}
	if s := p.Summary(); s.UsedMilli != 0 || s.LentMilli != 0 {
		t.Fatalf("all released: %+v", s)
	}
}

// TestConcurrentLending: workers acquire, sleep, wake and release at once
// (degrade policy, so wakes cut and releases raise concurrently); the books
// balance at every check and end empty.
func TestConcurrentLending(t *testing.T) {
	b := newFake()
	b.limit = 1000
	c := cfg(Affinity, "250m=4")
	c.MaxSlots = 16
	c.LendRatio = 0.5
	c.Policy = admission.Degrade
	c.DefaultWait = 2 * time.Second
	p := start(t, c, b)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			o := NewOwner()
			for i := 0; i < 100; i++ {
				g, err := p.Acquire(context.Background(), req(o, 250, uint32(w+1), 0))
				if err != nil {
					t.Error(err)
					return
				}
				if (w+i)%3 != 0 {
					if err := p.Sleep(o, g.Lease); err != nil {
						t.Error(err)
					}
					if (w+i)%2 == 0 {
						if err := p.Wake(o, g.Lease); err != nil {
							t.Error(err)
						}
					}
				}
				if _, err := p.Release(o, g.Lease, outcome.EndOK); err != nil {
					t.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	if s := p.Summary(); s.Leases != 0 || s.UsedMilli != 0 || s.LentMilli != 0 || s.Degraded != 0 {
		t.Fatalf("books do not balance: %+v", s)
	}
}

// TestFailedRetunesAreUndone: a wake's cuts whose retunes fail leave the
// borrowers at their old quota and charge it again (the slots run at it);
// a raise whose retune fails gives the budget back and stays degraded.
func TestFailedRetunesAreUndone(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()
	p, b := lendPool(t, 0.5, admission.Queue)
	g1 := must(t)(p.Acquire(ctx, req(o, 500, 1, 0)))
	g2 := must(t)(p.Acquire(ctx, req(o, 500, 2, 0)))
	must(t)(nil, p.Sleep(o, g1.Lease))
	g3 := must(t)(p.Acquire(ctx, req(o, 250, 3, 0)))
	b.mu.Lock()
	b.failRetune = true
	b.mu.Unlock()
	if err := p.Wake(o, g1.Lease); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	for _, g := range []*Grant{g2, g3} {
		if l := p.leases[g.Lease]; l.granted != g.Spec.QuotaMilli || l.slot.spec.QuotaMilli != g.Spec.QuotaMilli {
			t.Errorf("lease %d: granted %dm, slot %dm after a failed cut, want both %dm",
				g.Lease, l.granted, l.slot.spec.QuotaMilli, g.Spec.QuotaMilli)
		}
	}
	p.mu.Unlock()
	if s := p.Summary(); s.UsedMilli != 1250 {
		t.Fatalf("used %dm after failed cuts, want 1250m (what the slots run at)", s.UsedMilli)
	}
	// Release the waker: the budget frees, but raising a degraded lease
	// fails too; nothing is degraded (the cuts never happened).
	p.Release(o, g1.Lease, outcome.EndOK)
	if s := p.Summary(); s.UsedMilli != 750 || s.Degraded != 0 {
		t.Fatalf("after release: %+v", s)
	}
}

// TestSleepersAreNotRaised: budget freed while a degraded lease sleeps goes
// to awake degraded leases (a sleeper runs nothing with it, and a raise
// charged to a sleeper is budget no one can use until it wakes); the
// sleeper is raised when it wakes into free budget.
func TestSleepersAreNotRaised(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()
	p, b := lendPool(t, 1, admission.Queue)
	g1 := must(t)(p.Acquire(ctx, req(o, 500, 1, 0)))
	g2 := must(t)(p.Acquire(ctx, req(o, 500, 2, 0)))
	must(t)(nil, p.Sleep(o, g1.Lease))
	g3 := must(t)(p.Acquire(ctx, req(o, 500, 3, 0)))
	b.takeOps()
	must(t)(nil, p.Wake(o, g1.Lease)) // cuts g3 to 50m, g2 to 450m
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprintf("[retune %d 50m retune %d 450m]", g3.SlotID, g2.SlotID) {
		t.Fatalf("wake's cuts: %v", ops)
	}
	// The borrower cut first sleeps: what it lends raises g2, not itself.
	must(t)(nil, p.Sleep(o, g3.Lease))
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprintf("[retune %d 500m]", g2.SlotID) {
		t.Fatalf("a degraded sleeper's lent quota should raise the awake degraded lease: %v", ops)
	}
	checkBound(t, p)
	// Budget freed by a release while it sleeps stays free for it.
	p.Release(o, g2.Lease, outcome.EndOK)
	if ops := b.takeOps(); len(ops) != 0 {
		t.Fatalf("a release raised a sleeper: %v", ops)
	}
	if s := p.Summary(); s.UsedMilli != 500 || s.Degraded != 1 {
		t.Fatalf("after the release: %+v", s)
	}
	// It wakes into free budget: raised to what it asked for.
	must(t)(nil, p.Wake(o, g3.Lease))
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprintf("[retune %d 500m]", g3.SlotID) {
		t.Fatalf("a degraded lease waking into free budget should be raised: %v", ops)
	}
	if s := p.Summary(); s.UsedMilli != 1000 || s.Degraded != 0 || s.LentMilli != 0 {
		t.Fatalf("after the wake: %+v", s)
	}
	checkBound(t, p)
}

// TestRaisesResumeAfterARaise: budget freed while the oldest degraded
// lease's raise is still being written is handed out once that write ends,
// not left idle until the next release or sleep.
func TestRaisesResumeAfterARaise(t *testing.T) {
	ctx := context.Background()
	o := NewOwner()
	p, b := lendPool(t, 0.5, admission.Queue)
	g0 := must(t)(p.Acquire(ctx, req(o, 100, 1, 0)))
	g1 := must(t)(p.Acquire(ctx, req(o, 400, 2, 0)))
	g2 := must(t)(p.Acquire(ctx, req(o, 500, 3, 0)))
	must(t)(nil, p.Sleep(o, g1.Lease)) // lends 200m
	g3 := must(t)(p.Acquire(ctx, req(o, 200, 4, 0)))
	b.takeOps()
	must(t)(nil, p.Wake(o, g1.Lease)) // cuts g3 to 50m, g2 to 450m
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprintf("[retune %d 50m retune %d 450m]", g3.SlotID, g2.SlotID) {
		t.Fatalf("wake's cuts: %v", ops)
	}
	// g0's release raises g3 by 100m; hold that write while g1's release
	// frees 400m more.
	entered, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.onIO = func(op string) {
		if op == "retune %d %dm" {
			once.Do(func() { close(entered); <-proceed })
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Release(o, g0.Lease, outcome.EndOK)
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("g0's release wrote no raise of g3 (want retune of g3 to 150m)")
	}
	p.Release(o, g1.Lease, outcome.EndOK)
	close(proceed)
	<-done
	ops := b.takeOps()
	want := fmt.Sprintf("[retune %d 150m retune %d 200m retune %d 500m]", g3.SlotID, g3.SlotID, g2.SlotID)
	if fmt.Sprint(ops) != want {
		t.Fatalf("after the raise was written: %v, want %s", ops, want)
	}
	if s := p.Summary(); s.Degraded != 0 || s.UsedMilli != 700 {
		t.Fatalf("%+v", s)
	}
	checkBound(t, p)
}

// TestFlappingLeaseRetunesOncePerPeriod: a lease
// whose runtime flaps SLEEP and WAKE as fast as it can costs at most one
// lend, and so one retune of its borrowers each way, per CFS period: a
// SLEEP within a period of the lease's last lend lends only once the
// period is over, if the lease still sleeps then.
func TestFlappingLeaseRetunesOncePerPeriod(t *testing.T) {
	o := NewOwner()
	p, b := lendPool(t, 1, admission.Queue)
	sleeper := sleeperAndBorrower(t, p, o)
	b.takeOps()
	const flaps = 2000
	start := time.Now()
	for i := 0; i < flaps; i++ {
		must(t)(nil, p.Wake(o, sleeper.Lease))
		must(t)(nil, p.Sleep(o, sleeper.Lease))
	}
	elapsed := time.Since(start)
	ops := len(b.takeOps())
	period := time.Duration(p.cfg.PeriodUS) * time.Microsecond
	// Each period at most one lend (a raise) and one wake (a cut), and the
	// first wake's cut.
	allowed := 2*int(elapsed/period+1) + 1
	t.Logf("%d flaps in %v: %d cgroup writes, %d lends", flaps, elapsed.Round(time.Millisecond), ops, p.Summary().Lends)
	if ops > allowed {
		t.Fatalf("%d flaps in %v made %d cgroup writes, want at most %d (one retune each way per %v period)", flaps, elapsed, ops, allowed, period)
	}
	checkBound(t, p)
	// A lease that stays asleep lends once the period is over.
	deadline := time.Now().Add(time.Minute)
	for p.Summary().LentMilli != 500 {
		if time.Now().After(deadline) {
			t.Fatalf("a lease asleep for a minute lends nothing: %+v", p.Summary())
		}
		time.Sleep(time.Millisecond)
	}
	checkBound(t, p)
}

// TestWakeDuringRaiseCutsWhenItEnds: a WAKE that comes while the leases it
// would cut are being raised (a lend's raise on another goroutine: a lend
// the period deferred, or another connection's SLEEP) cannot cut them
// then; once their raise is written, the pool cuts what the wake owes, so
// the container is not left over its budget until a release.
func TestWakeDuringRaiseCutsWhenItEnds(t *testing.T) {
	o := NewOwner()
	p, b := lendPool(t, 1, admission.Queue)
	sleeper := sleeperAndBorrower(t, p, o)
	must(t)(nil, p.Wake(o, sleeper.Lease)) // both others cut, degraded
	if s := p.Summary(); s.Degraded != 2 {
		t.Fatalf("after the first wake: %+v, want both others degraded", s)
	}
	checkBound(t, p)
	// The next SLEEP lends at once once a period has passed; its raises of
	// the degraded leases block in their first write.
	time.Sleep(time.Duration(p.cfg.PeriodUS)*time.Microsecond + 10*time.Millisecond)
	blocked, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.onIO = func(op string) {
		if strings.HasPrefix(op, "retune") {
			once.Do(func() { close(blocked); <-unblock })
		}
	}
	slept := make(chan error, 1)
	go func() { slept <- p.Sleep(o, sleeper.Lease) }()
	select {
	case <-blocked:
	case <-time.After(time.Minute):
		t.Fatal("the SLEEP raised no degraded lease")
	}
	woke := make(chan error, 1)
	go func() { woke <- p.Wake(o, sleeper.Lease) }()
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	close(unblock)
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
	b.onIO = nil
	checkBound(t, p)
}

// sleeperAndBorrower fills a 1000m budget with two 500m leases of o, puts
// the first to sleep and admits a 500m borrower into what it lends (lend
// ratio 1); it returns the sleeper.
func sleeperAndBorrower(t *testing.T, p *Pool, o Owner) *Grant {
	t.Helper()
	ctx := context.Background()
	sleeper := must(t)(p.Acquire(ctx, req(o, 500, 1, 0)))
	must(t)(p.Acquire(ctx, req(o, 500, 2, 0)))
	must(t)(nil, p.Sleep(o, sleeper.Lease))
	must(t)(p.Acquire(ctx, req(o, 500, 3, 0))) // the borrower
	return sleeper
}
