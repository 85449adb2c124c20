package agent_test

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
)

// TestLocalClientWaitersServedInTurn: more threads than the container's
// budget admits slots, in a closed loop, through local leasing (the
// client's default) against the real agent (admission policy queue). The
// process's held slots are the whole budget, so a thread without an entry
// is served only by entries the others release: every thread must complete
// a share of the invocations, each in its slot, none refused.
func TestLocalClientWaitersServedInTurn(t *testing.T) {
	for _, threads := range []int{3, 5} {
		t.Run(fmt.Sprintf("threads=%d", threads), func(t *testing.T) {
			// The wait for budget is a hang bound only. A waiting thread is
			// served by the first entry released, and a HOLD request sent
			// for it meanwhile waits at the agent, the budget being held by
			// the busy entries; its TIMEOUT reaches the thread only if no
			// entry came free in all that time. A 2 s bound expired so in
			// the emulated cgroup v2 VM on a loaded host (both holders in
			// slow cgroup moves, or the VM not run): load, not a missed
			// turn, which the shares below catch.
			const wait = time.Minute
			e := agenttest.NewEnv(t, 0, func(c *agent.Config) {
				c.Admission.Budget = "500m"
				c.Admission.Policy = "queue"
				c.Pool.MaxWait = agent.Duration{Duration: wait}
			})
			e.Start()
			cgrouptest.JoinProcess(t, e.H, e.Rel)
			c, err := client.Dial(e.Socket, client.Options{Wait: wait, Timeout: 2 * wait})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.Hello().Flags&slotv1.HelloOKLocal == 0 {
				t.Fatalf("the agent did not grant LOCAL: %+v", c.Hello())
			}
			// At least this many invocations and this long: one cgroup move on
			// v1 can take tens of ms, and a run shorter than a few of them says
			// nothing of turns (CI: a 40 ms run in which one thread's first
			// move took most of it).
			total := int64(300 * threads)
			const minRun = time.Second
			done := make([]atomic.Int64, threads)
			failed := make([]atomic.Int64, threads)
			var sum, outside atomic.Int64
			var firstErr atomic.Value
			var wg, ready sync.WaitGroup
			start := make(chan struct{})
			var deadline atomic.Int64
			running := func() bool {
				return sum.Load() < total || time.Now().UnixNano() < deadline.Load()
			}
			for w := 0; w < threads; w++ {
				wg.Add(1)
				ready.Add(1)
				go func() {
					defer wg.Done()
					runtime.LockOSThread() // never unlocked: the thread ends in a slot
					ready.Done()
					<-start // the closed loop starts for all threads at once
					for running() {
						l, err := c.Acquire(250, "guest/fair", "")
						if err != nil {
							failed[w].Add(1)
							firstErr.CompareAndSwap(nil, err)
							continue
						}
						if !l.Local || !inSlot(e.H, e.Rel, l.Slot) {
							outside.Add(1)
						}
						for i := 0; i < 20000; i++ { // a little CPU in the slot
							_ = i * i
						}
						if _, err := l.Release(slotv1.InvocationOK); err != nil {
							firstErr.CompareAndSwap(nil, err)
						}
						done[w].Add(1)
						sum.Add(1)
					}
				}()
			}
			ready.Wait()
			deadline.Store(time.Now().Add(minRun).UnixNano())
			close(start)
			wg.Wait()
			var counts, fails []int64
			for w := range done {
				counts = append(counts, done[w].Load())
				fails = append(fails, failed[w].Load())
			}
			if err, _ := firstErr.Load().(error); err != nil {
				t.Logf("first error: %v", err)
			}
			t.Logf("completed %v, failed %v", counts, fails)
			if outside.Load() != 0 {
				t.Errorf("%d invocations not local or not in their slot", outside.Load())
			}
			fair := sum.Load() / int64(threads)
			for w := range counts {
				if counts[w]*4 < fair || fails[w] != 0 {
					t.Fatalf("thread %d completed %d invocations (an equal share is %d) and failed %d; all: completed %v failed %v",
						w, counts[w], fair, fails[w], counts, fails)
				}
			}
		})
	}
}
