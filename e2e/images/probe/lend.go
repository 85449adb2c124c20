package main

import (
	"encoding/json"
	"log"
	"os"
	"runtime"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

// lendResult is what `probe lend` prints.
type lendResult struct {
	// Lend: the agent's HELLO_OK said LEND.
	Lend bool `json:"lend"`
	// Borrower: the 250m acquisition while the first 500m lease slept
	// ("" when admitted; else the error).
	BorrowerErr   string `json:"borrowerErr"`
	BorrowerMilli uint32 `json:"borrowerMilli"`
	Borrowed      bool   `json:"borrowed"`
	// AfterWake: the same acquisition once the sleeper woke.
	AfterWakeErr string `json:"afterWakeErr"`
	AfterWake    bool   `json:"afterWake"`
}

// runLend, for a pod with a 1-CPU limit and cpuslot.dev/lend-ratio 0.5:
// two 500m leases fill the budget; while the first sleeps, a 250m lease
// asks (admitted into what the sleeper lends); the sleeper wakes; another
// 250m asks (the budget is full again: it waits its 200 ms and times out).
// Each lease on a thread of its own (a thread sits in one slot).
func runLend(args []string) {
	newFlags("lend").Parse(args)
	c, err := client.Dial(socketPath(), client.Options{Name: "e2e-probe", NoLocal: true, Wait: 200 * time.Millisecond})
	if err != nil {
		log.Fatalf("probe: %v", err)
	}
	r := lendResult{Lend: c.Hello().Flags&slotv1.HelloOKLend != 0}
	var threads []thread
	acquire := func(q uint32) (*client.Lease, thread, error) {
		t := newThread()
		threads = append(threads, t)
		var l *client.Lease
		var err error
		t.do(func() { l, err = c.Acquire(q, "e2e/lend", "") })
		return l, t, err
	}
	a, ta, err := acquire(500)
	if err != nil {
		log.Fatalf("probe: first 500m: %v", err)
	}
	b, tb, err := acquire(500)
	if err != nil {
		log.Fatalf("probe: second 500m: %v", err)
	}
	if err := a.Sleep(); err != nil {
		log.Fatalf("probe: sleep: %v", err)
	}
	borrower, tc, err := acquire(250)
	if err != nil {
		r.BorrowerErr = err.Error()
	} else {
		r.Borrowed, r.BorrowerMilli = true, borrower.QuotaMilli
	}
	if err := a.Wake(); err != nil {
		log.Fatalf("probe: wake: %v", err)
	}
	late, td, err := acquire(250)
	if err != nil {
		r.AfterWakeErr = err.Error()
	} else {
		r.AfterWake = true
		td.do(func() { late.Release(slotv1.InvocationOK) })
	}
	if borrower != nil {
		tc.do(func() { borrower.Release(slotv1.InvocationOK) })
	}
	tb.do(func() { b.Release(slotv1.InvocationOK) })
	ta.do(func() { a.Release(slotv1.InvocationOK) })
	for _, t := range threads {
		t.close()
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

// thread runs functions on one locked OS thread until closed: a lease
// stays on the thread that acquired it.
type thread chan func()

func newThread() thread {
	t := make(thread)
	go func() {
		runtime.LockOSThread()
		for f := range t {
			f()
		}
	}()
	return t
}

func (t thread) do(f func()) {
	done := make(chan struct{})
	t <- func() { f(); close(done) }
	<-done
}

func (t thread) close() { close(t) }
