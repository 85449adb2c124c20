package client_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

// onThread runs f on a locked OS thread of its own (a distinct TID), as a
// runtime's invocation thread is.
func onThread(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Never unlocked: the thread exits with the goroutine, so the next
		// onThread runs on a thread (and TID) of its own.
		runtime.LockOSThread()
		f()
	}()
	<-done
}

func dialFake(t *testing.T, f *fakeAgent, o client.Options) *client.Client {
	t.Helper()
	c, err := client.Dial(f.path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestLocalSteadyState: a thread repeating invocations of one quota asks
// the agent once (a HOLD lease), writes once, and then neither writes nor
// sends anything per invocation; usage is measured per invocation and
// reaches the agent summed in USAGE.
func TestLocalSteadyState(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{})
	if h := f.helloFlags(); h&slotv1.HelloLocal == 0 || c.Table() == nil {
		t.Fatalf("hello flags %#x, table %v", h, c.Table())
	}
	const n = 50
	onThread(func() {
		for i := 0; i < n; i++ {
			l, err := c.Acquire(250, "guest/fib", "")
			if err != nil {
				t.Fatal(err)
			}
			if !l.Local {
				t.Fatalf("invocation %d: not a local lease", i)
			}
			if i > 0 && (l.Place != slotv1.PlaceNone || l.Outcome != slotv1.OutcomeAffinityHit) {
				t.Fatalf("invocation %d: place %d outcome %s, want no write", i, l.Place, l.Outcome)
			}
			f.burn(l.Slot, 3*time.Millisecond)
			u, err := l.Release(slotv1.InvocationOK)
			if err != nil {
				t.Fatal(err)
			}
			if u.CPU != 3*time.Millisecond {
				t.Fatalf("invocation %d used %v, want 3ms", i, u.CPU)
			}
		}
	})
	if h, a := f.count("hold"), f.count("acquire"); h != 1 || a != 0 {
		t.Fatalf("%d HOLD and %d thread acquisitions for %d invocations, want 1 and 0", h, a, n)
	}
	waitFor(t, "the placement write", func() bool { return f.writes() == 1 })
	c.Close() // sends what is pending
	waitFor(t, "USAGE of every invocation", func() bool {
		var inv uint32
		for _, r := range f.usageRecords() {
			inv += r.Invocations
		}
		return inv >= n
	})
	var inv uint32
	var cpu uint64
	for _, r := range f.usageRecords() {
		if r.Action != "guest/fib" || r.Outcome != slotv1.InvocationOK {
			t.Fatalf("usage record %+v", r)
		}
		inv += r.Invocations
		cpu += r.CPUNanos
	}
	if inv != n || cpu != uint64(n*3*time.Millisecond) {
		t.Fatalf("usage: %d invocations, %d ns; want %d, %d", inv, cpu, n, n*3*time.Millisecond)
	}
	waitFor(t, "the HOLD lease released at close", func() bool { return f.count("release") == 1 })
}

// TestLocalThreadsShareHeldSlots: a slot one thread released is claimed by
// another thread with one write and no message to the agent; two threads
// at once get two slots.
func TestLocalThreadsShareHeldSlots(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{})
	var first uint32
	onThread(func() {
		l, err := c.Acquire(500, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		first = l.Slot
		l.Release(slotv1.InvocationOK)
	})
	onThread(func() {
		l, err := c.Acquire(500, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		if l.Slot != first || l.Place != slotv1.PlaceSelf || l.Outcome != slotv1.OutcomeCacheHit {
			t.Fatalf("second thread: slot %d place %d outcome %s; want slot %d with one write", l.Slot, l.Place, l.Outcome, first)
		}
		// Meanwhile a third thread needs a slot of its own.
		onThread(func() {
			l2, err := c.Acquire(500, "a", "")
			if err != nil {
				t.Fatal(err)
			}
			if l2.Slot == first {
				t.Fatal("two threads in one held slot at once")
			}
			l2.Release(slotv1.InvocationOK)
		})
		l.Release(slotv1.InvocationOK)
	})
	if h := f.count("hold"); h != 2 {
		t.Fatalf("%d HOLD leases, want 2", h)
	}
	waitFor(t, "3 placement writes", func() bool { return f.writes() == 3 })
}

// TestLocalOffKeepsOldPath: with NoLocal the client neither asks for LOCAL
// nor holds slots: every invocation asks the agent.
func TestLocalOffKeepsOldPath(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{NoLocal: true})
	if h := f.helloFlags(); h&slotv1.HelloLocal != 0 || c.Table() != nil {
		t.Fatalf("NoLocal: hello flags %#x, table %v", h, c.Table())
	}
	onThread(func() {
		for i := 0; i < 5; i++ {
			l, err := c.Acquire(250, "a", "")
			if err != nil || l.Local {
				t.Fatalf("%v local=%v", err, l != nil && l.Local)
			}
			l.Release(slotv1.InvocationOK)
		}
	})
	if a, h := f.count("acquire"), f.count("hold"); a != 5 || h != 0 {
		t.Fatalf("%d acquisitions, %d HOLD; want 5, 0", a, h)
	}
}

// TestLocalAgentWithoutLocal: an agent that does not grant LOCAL gets the
// old path (no HOLD it would refuse).
func TestLocalAgentWithoutLocal(t *testing.T) {
	f := newFakeAgent(t, false)
	c := dialFake(t, f, client.Options{})
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil || l.Local {
			t.Fatalf("%v", err)
		}
		l.Release(slotv1.InvocationOK)
	})
	if a, h := f.count("acquire"), f.count("hold"); a != 1 || h != 0 {
		t.Fatalf("%d acquisitions, %d HOLD; want 1, 0", a, h)
	}
}

// TestLocalUsageBatches: usage of many actions travels in USAGE messages of
// at most 8 records, summed per action and outcome, nothing lost.
func TestLocalUsageBatches(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{})
	want := map[string]uint32{}
	onThread(func() {
		for i := 0; i < 60; i++ {
			action := fmt.Sprintf("fn%d", i%12)
			outcome := slotv1.InvocationOK
			if i%5 == 0 {
				outcome = slotv1.InvocationTimeout
			}
			l, err := c.Acquire(250, action, "")
			if err != nil {
				t.Fatal(err)
			}
			l.Release(outcome)
			want[fmt.Sprintf("%s/%s", action, outcome)]++
		}
	})
	c.Close()
	var got map[string]uint32
	waitFor(t, "60 invocations in USAGE", func() bool {
		got = map[string]uint32{}
		n := uint32(0)
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, u := range f.usage {
			if len(u.Records) > slotv1.MaxUsageRecords {
				t.Errorf("USAGE of %d records", len(u.Records))
			}
			for _, r := range u.Records {
				got[fmt.Sprintf("%s/%s", r.Action, r.Outcome)] += r.Invocations
				n += r.Invocations
			}
		}
		return n >= 60
	})
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("usage\n got %v\nwant %v", got, want)
	}
}

// TestLocalInvalidAction: an action the protocol cannot carry is refused at
// Acquire, as the agent refuses it on the old path.
func TestLocalInvalidAction(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{})
	onThread(func() {
		if _, err := c.Acquire(250, "bad\naction", ""); err == nil {
			t.Fatal("accepted")
		}
	})
}

// TestLocalIdleDrop: a held slot unused for LocalIdle is given back (one
// RELEASE of its HOLD lease) and its entry emptied; the next invocation is
// a miss again.
func TestLocalIdleDrop(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{LocalIdle: 20 * time.Millisecond})
	acquire := func() {
		onThread(func() {
			l, err := c.Acquire(250, "a", "")
			if err != nil {
				t.Fatal(err)
			}
			l.Release(slotv1.InvocationOK)
		})
	}
	acquire()
	waitFor(t, "the idle HOLD lease released", func() bool { return f.count("release") == 1 })
	for i := 0; i < c.Table().Cap(); i++ {
		if e := c.Table().Entry(i); e.Slot != 0 {
			t.Fatalf("entry %d still holds slot %d after the drop", i, e.Slot)
		}
	}
	acquire()
	if h := f.count("hold"); h != 2 {
		t.Fatalf("%d HOLD leases, want 2 (a miss after the drop)", h)
	}
}

// TestLocalAgentAway: while the agent is gone, invocations of quotas the
// process holds keep claiming their slots (every one placed, none fails
// open); the new agent learns the held slots from RECLAIM (tid 0) without
// any invocation asking, and the entries carry the new lease ids.
func TestLocalAgentAway(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{ReconnectFor: 50 * time.Millisecond})
	var wg sync.WaitGroup
	// Two quotas held by two threads.
	for _, q := range []uint32{150, 750} {
		onThread(func() {
			l, err := c.Acquire(q, "a", "")
			if err != nil {
				t.Fatal(err)
			}
			l.Release(slotv1.InvocationOK)
		})
	}
	oldLeases := map[uint64]bool{}
	for i := 0; i < c.Table().Cap(); i++ {
		if e := c.Table().Entry(i); e.Slot != 0 {
			oldLeases[e.Lease] = true
		}
	}
	f.stop()
	for _, q := range []uint32{150, 750} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			onThread(func() {
				for i := 0; i < 100; i++ {
					l, err := c.Acquire(q, "a", "")
					if err != nil || !l.Local {
						t.Errorf("quota %d, invocation %d while the agent is away: %v", q, i, err)
						return
					}
					l.Release(slotv1.InvocationOK)
				}
			})
		}()
	}
	wg.Wait()
	f.restart()
	waitFor(t, "2 RECLAIMs", func() bool { return f.count("reclaim") >= 2 })
	waitFor(t, "new lease ids in the table", func() bool {
		n := 0
		for i := 0; i < c.Table().Cap(); i++ {
			if e := c.Table().Entry(i); e.Slot != 0 && !oldLeases[e.Lease] && e.Lease != 0 {
				n++
			}
		}
		return n == 2
	})
	if h := f.count("hold"); h != 2 {
		t.Fatalf("%d HOLD leases, want the 2 before the restart", h)
	}
	f.mu.Lock()
	for _, r := range f.reclaims {
		if r.TID != 0 || r.Action != "" || r.Invocation != "" || (r.QuotaMilli != 150 && r.QuotaMilli != 750) {
			t.Errorf("RECLAIM of a held slot: %+v, want tid 0, no action, the granted quota", r)
		}
	}
	f.mu.Unlock()
	// Usage of the invocations while away reaches the new agent.
	c.Close()
	var inv uint32
	waitFor(t, "USAGE of 202 invocations", func() bool {
		inv = 0
		for _, r := range f.usageRecords() {
			inv += r.Invocations
		}
		return inv >= 202
	})
	if inv != 202 {
		t.Fatalf("usage of %d invocations reached the agents, want 202", inv)
	}
}

// TestLocalReclaimRefused: a held slot the new agent refuses is marked GONE,
// claimed no more, and dropped without a RELEASE; the quota's next
// invocation is a miss.
func TestLocalReclaimRefused(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{ReconnectFor: 50 * time.Millisecond})
	acquire := func() *client.Lease {
		var l *client.Lease
		onThread(func() {
			var err error
			if l, err = c.Acquire(333, "a", ""); err != nil {
				t.Fatal(err)
			}
			l.Release(slotv1.InvocationOK)
		})
		return l
	}
	first := acquire()
	f.mu.Lock()
	f.refuseReclaim = true
	f.mu.Unlock()
	f.restart()
	waitFor(t, "the refused RECLAIM", func() bool { return f.count("reclaim") == 1 })
	waitFor(t, "the GONE entry dropped", func() bool {
		for i := 0; i < c.Table().Cap(); i++ {
			if c.Table().Entry(i).Slot == first.Slot {
				return false
			}
		}
		return true
	})
	acquire()
	if h, r := f.count("hold"), f.count("release"); h != 2 || r != 0 {
		t.Fatalf("%d HOLD, %d RELEASE; want 2 (a miss after GONE), 0 (a refused lease is not released)", h, r)
	}
}

// TestLocalTableFull: with every entry taken, a miss leases for the thread
// as without local leasing, and gives the HOLD lease back.
func TestLocalTableFull(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{TableCapacity: 1})
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil || !l.Local {
			t.Fatal(err)
		}
		onThread(func() {
			l2, err := c.Acquire(250, "a", "")
			if err != nil {
				t.Fatal(err)
			}
			if l2.Local {
				t.Fatal("a second local lease in a 1-entry table")
			}
			if _, err := l2.Release(slotv1.InvocationOK); err != nil {
				t.Fatal(err)
			}
		})
		l.Release(slotv1.InvocationOK)
	})
	if a := f.count("acquire"); a != 1 {
		t.Fatalf("%d thread acquisitions, want 1", a)
	}
	waitFor(t, "the unpublishable HOLD lease released", func() bool { return f.count("release") >= 2 })
}

// TestLocalDoubleRelease: releasing a local lease twice is an error and
// does not free the entry for a second thread while a first one holds it.
func TestLocalDoubleRelease(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{TableCapacity: 1})
	var first *client.Lease
	onThread(func() {
		var err error
		if first, err = c.Acquire(250, "a", ""); err != nil {
			t.Fatal(err)
		}
		if _, err := first.Release(slotv1.InvocationOK); err != nil {
			t.Fatal(err)
		}
	})
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil || !l.Local {
			t.Fatalf("%v", err)
		}
		if _, err := first.Release(slotv1.InvocationOK); err == nil {
			t.Error("a second Release of a local lease succeeded")
		}
		if h := slotv1.Holder(c.Table().State(0)); h == 0 {
			t.Error("a stale Release freed the entry another thread holds")
		}
		l.Release(slotv1.InvocationOK)
	})
}

// TestLocalMissMakesRoom: held slots count against the container's budget
// while idle. A miss that would not fit gives back the process's least
// recently used free held slots first (on the same connection, so the
// agent sees them go before the new HOLD): with the budget announced in
// HELLO_OK before asking, and after a REJECTED when it is not.
func TestLocalMissMakesRoom(t *testing.T) {
	for _, say := range []bool{true, false} {
		t.Run(fmt.Sprintf("budget_announced=%v", say), func(t *testing.T) {
			f := newFakeAgent(t, true)
			f.mu.Lock()
			f.budget, f.sayBudget = 1000, say
			f.mu.Unlock()
			c := dialFake(t, f, client.Options{})
			for _, q := range []uint32{750, 150, 500} {
				onThread(func() {
					l, err := c.Acquire(q, "a", "")
					if err != nil {
						t.Fatalf("quota %d: %v", q, err)
					}
					if !l.Local {
						t.Fatalf("quota %d: not local", q)
					}
					l.Release(slotv1.InvocationOK)
				})
			}
			if h, r := f.count("hold"), f.count("release"); h < 3 || r != 1 {
				t.Fatalf("%d HOLD, %d RELEASE; want 3 (or 4 with one rejected) and 1 (the 750m slot)", h, r)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.unknownReleases != 0 {
				t.Fatalf("%d unknown releases", f.unknownReleases)
			}
		})
	}
}

// budgeted1000 is a client of a fake agent with a 1000m budget, announced,
// that waits for budget; acquire takes a local lease of a quota on the
// calling thread and releases it.
func budgeted1000(t *testing.T) (*fakeAgent, *client.Client, func(q uint32) error) {
	f := newFakeAgent(t, true)
	f.mu.Lock()
	f.budget, f.sayBudget, f.queue = 1000, true, true
	f.mu.Unlock()
	c := dialFake(t, f, client.Options{Wait: 2 * time.Second})
	return f, c, func(q uint32) error {
		l, err := c.Acquire(q, "a", "")
		if err != nil {
			return fmt.Errorf("quota %d: %w", q, err)
		}
		if !l.Local {
			return fmt.Errorf("quota %d: not local", q)
		}
		_, err = l.Release(slotv1.InvocationOK)
		return err
	}
}

// roomMadeFirst waits for the 400m and 300m calls' outcomes on done: both
// in a slot, with three HOLD requests (500m, 400m, 300m) and none refused
// or waited out for budget.
func roomMadeFirst(t *testing.T, f *fakeAgent, done chan error) {
	t.Helper()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if to, rej, h := f.count("timeout"), f.count("rejected"), f.count("hold"); to != 0 || rej != 0 || h != 3 {
		t.Fatalf("%d HOLD, %d waited out for budget, %d rejected; want 3, 0, 0", h, to, rej)
	}
}

// TestLocalMissCountsAGrantOnItsWay: a miss decides what room to make
// from what the process holds, and a grant of another quota on its way
// (asked, not yet in the table) is held too. A 300m miss while a 400m grant
// is on its way, with a free 500m entry in a 1000m budget, must give the
// 500m back before asking; counted without the 400m, it asked first and
// waited at the agent for budget that only its own next move could free.
func TestLocalMissCountsAGrantOnItsWay(t *testing.T) {
	f, _, acquire := budgeted1000(t)
	onThread(func() {
		if err := acquire(500); err != nil { // a free 500m entry
			t.Fatal(err)
		}
	})
	gate := make(chan struct{})
	f.mu.Lock()
	f.holdGate = gate
	f.mu.Unlock()
	done := make(chan error, 2)
	go onThread(func() { done <- acquire(400) })
	waitFor(t, "the 400m HOLD at the agent", func() bool { return f.count("hold gated") == 1 })
	go onThread(func() { done <- acquire(300) })
	// Time for the 300m miss to decide (the test cannot see it); the
	// outcome does not depend on it.
	time.Sleep(100 * time.Millisecond)
	close(gate)
	roomMadeFirst(t, f, done)
}

// TestLocalMissCountsAGrantNotYetInTheTable: a 400m grant the agent has
// answered and the table does not hold yet is held: a 300m miss in that
// moment, with a free 500m entry in a 1000m budget, gives the 500m back
// before it asks (counted without the 400m, it asked with no room made and
// waited at the agent for budget).
func TestLocalMissCountsAGrantNotYetInTheTable(t *testing.T) {
	f, c, acquire := budgeted1000(t)
	// The 400m grant waits before its publish until the 300m HOLD has been
	// answered (or 10 s): the 300m miss decides its room in that moment.
	answered := make(chan struct{})
	c.AfterGrant(func(q uint32) {
		if q != 400 {
			return
		}
		select {
		case <-answered:
		case <-time.After(10 * time.Second):
		}
	})
	onThread(func() {
		if err := acquire(500); err != nil { // a free 500m entry
			t.Fatal(err)
		}
	})
	done := make(chan error, 2)
	go onThread(func() { done <- acquire(400) })
	waitFor(t, "the 400m HOLD answered", func() bool { return f.count("hold") == 2 })
	go onThread(func() {
		err := acquire(300)
		close(answered)
		done <- err
	})
	roomMadeFirst(t, f, done)
}

// TestLocalCloseReleasesALateGrant: a thread waits for an entry, the
// client asks the agent for a HOLD lease, and another thread's release
// serves the waiter before the grant arrives. The grant then lands as a
// free entry of the process; when it lands after Close began, Close must
// still give it back (CI: TestScribbledTable timed out waiting for the
// RELEASE of the last lease granted, one run in four).
func TestLocalCloseReleasesALateGrant(t *testing.T) {
	f := newFakeAgent(t, true)
	c, err := client.Dial(f.path, client.Options{Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan *client.Lease)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in a slot
		l, err := c.Acquire(250, "a", "")
		if err != nil {
			t.Error(err)
		}
		first <- l
	}()
	l1 := <-first
	gate := make(chan struct{})
	f.mu.Lock()
	f.holdGate = gate
	f.mu.Unlock()
	second := make(chan error)
	go func() {
		runtime.LockOSThread()
		l, err := c.Acquire(250, "a", "") // waits: the one entry is held; a HOLD goes out
		if err == nil {
			_, err = l.Release(slotv1.InvocationOK)
		}
		second <- err
	}()
	waitFor(t, "the HOLD request", func() bool { return f.count("hold gated") == 1 })
	if _, err := l1.Release(slotv1.InvocationOK); err != nil { // serves the waiter
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	time.Sleep(50 * time.Millisecond) // Close has begun
	select {
	case <-closed:
		t.Fatal("Close returned while a HOLD request was on its way: its grant would be nobody's")
	default:
	}
	close(gate) // the grant arrives
	<-closed
	waitFor(t, "every lease released", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.leases) == 0
	})
}
