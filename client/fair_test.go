package client_test

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

// closedLoop runs threads locked OS threads, each acquiring quotaMilli,
// calling work in the slot and releasing, again and again, until the
// threads have completed total invocations between them and a second has
// passed (a shorter run says nothing of turns when one thread is
// descheduled on a busy machine). All threads start together. It returns each
// thread's completed invocations and acquisitions that failed.
func closedLoop(t testing.TB, c *client.Client, threads, total int, quotaMilli uint32, work func(*client.Lease)) ([]int64, []int64) {
	t.Helper()
	done := make([]atomic.Int64, threads)
	failed := make([]atomic.Int64, threads)
	var sum atomic.Int64
	var firstErr atomic.Value
	var wg, ready sync.WaitGroup
	start := make(chan struct{})
	var deadline atomic.Int64
	for w := 0; w < threads; w++ {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: a TID of its own
			ready.Done()
			<-start
			for sum.Load() < int64(total) || time.Now().UnixNano() < deadline.Load() {
				l, err := c.Acquire(quotaMilli, "guest/fair", "")
				if err != nil {
					failed[w].Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				work(l)
				if _, err := l.Release(slotv1.InvocationOK); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
				done[w].Add(1)
				sum.Add(1)
			}
		}()
	}
	ready.Wait()
	deadline.Store(time.Now().Add(time.Second).UnixNano())
	close(start)
	wg.Wait()
	d, f := make([]int64, threads), make([]int64, threads)
	for w := range d {
		d[w], f[w] = done[w].Load(), failed[w].Load()
	}
	if err, _ := firstErr.Load().(error); err != nil {
		t.Logf("first error: %v", err)
	}
	return d, f
}

// checkFair fails unless every thread completed at least a quarter of
// what an equal share of the invocations would be, and none failed one:
// a thread starved while the others loop on the process's held slots.
func checkFair(t testing.TB, done, failed []int64) {
	t.Helper()
	var sum int64
	for _, d := range done {
		sum += d
	}
	fair := sum / int64(len(done))
	for w := range done {
		if done[w]*4 < fair || failed[w] != 0 {
			t.Fatalf("thread %d completed %d of %d invocations (an equal share is %d) and failed %d acquisitions; all threads: done %v failed %v",
				w, done[w], sum, fair, failed[w], done, failed)
		}
	}
}

// TestLocalWaitersAreServedInTurn: three threads in a closed loop share a
// budget of two held slots. A thread without an entry waits while the two
// holders release and re-claim theirs; each released entry must go to the
// thread that waits before its last holder takes it again, so every thread
// completes its share (not a thread starved until its wait at the agent
// times out).
func TestLocalWaitersAreServedInTurn(t *testing.T) {
	for _, threads := range []int{3, 5} {
		t.Run(fmt.Sprintf("threads=%d", threads), func(t *testing.T) {
			f := newFakeAgent(t, true)
			f.mu.Lock()
			f.budget, f.sayBudget, f.queue = 500, true, true
			f.mu.Unlock()
			c := dialFake(t, f, client.Options{Wait: 2 * time.Second})
			done, failed := closedLoop(t, c, threads, 100*threads, 250, func(l *client.Lease) {
				f.burn(l.Slot, time.Millisecond)
				time.Sleep(50 * time.Microsecond) // the invocation
			})
			t.Logf("done %v failed %v; %d HOLD, %d timeouts", done, failed, f.count("hold"), f.count("timeout"))
			checkFair(t, done, failed)
		})
	}
}
