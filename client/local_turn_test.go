package client_test

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

// turnBudget is the acquire budget (Options.Wait) of the waiting-in-turn
// tests.
const turnBudget = time.Second

type acquired struct {
	l   *client.Lease
	err error
}

// acquireOn acquires quotaMilli on a locked OS thread of its own (a TID
// of its own) once start is closed, and sends the outcome. The thread
// lives until the test ends: the client reclaims a dead thread's entry.
func acquireOn(t *testing.T, c *client.Client, quotaMilli uint32, start <-chan struct{}) <-chan acquired {
	got := make(chan acquired, 1)
	end := make(chan struct{})
	t.Cleanup(func() { close(end) })
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in a slot
		<-start
		l, err := c.Acquire(quotaMilli, "guest/turn", "")
		got <- acquired{l, err}
		<-end
	}()
	return got
}

// await returns what thread name got, failing when it gets nothing within
// a minute.
func await(t *testing.T, name string, got <-chan acquired) acquired {
	t.Helper()
	select {
	case a := <-got:
		return a
	case <-time.After(time.Minute):
		t.Fatalf("thread %s got neither a slot nor an error within a minute", name)
		return acquired{}
	}
}

// missTogether starts three threads that miss together and returns what
// each got.
func missTogether(t *testing.T, c *client.Client) []acquired {
	start := make(chan struct{})
	var chans []<-chan acquired
	for range 3 {
		chans = append(chans, acquireOn(t, c, 250, start))
	}
	close(start)
	var out []acquired
	for i, ch := range chans {
		out = append(out, await(t, fmt.Sprint(i), ch))
	}
	return out
}

// TestLocalTurnWithinBudget: three threads miss together and HOLD requests
// go one at a time, so the third is served by the third answer, past its
// own budget. The agent answers each in 0.4 of the budget (0.6 of it is
// the margin for a busy machine): each answer keeps the rest waiting, and
// every thread gets a slot.
func TestLocalTurnWithinBudget(t *testing.T) {
	f := newFakeAgent(t, true)
	f.mu.Lock()
	f.holdDelay = turnBudget * 2 / 5
	f.mu.Unlock()
	c := dialFake(t, f, client.Options{Wait: turnBudget})
	slots := map[uint32]bool{}
	for i, a := range missTogether(t, c) {
		if a.err != nil {
			t.Fatalf("thread %d: %v", i, a.err)
		}
		if !a.l.Local || slots[a.l.Slot] {
			t.Fatalf("thread %d: local %v slot %d; want a held slot of its own", i, a.l.Local, a.l.Slot)
		}
		slots[a.l.Slot] = true
	}
}

// TestLocalTurnPastBudget: an agent that grants nothing within the budget
// sends every waiting thread on without a slot (TIMEOUT), none waiting for
// the late answer.
func TestLocalTurnPastBudget(t *testing.T) {
	f := newFakeAgent(t, true)
	gate := make(chan struct{})
	f.mu.Lock()
	f.holdGate = gate
	f.mu.Unlock()
	c := dialFake(t, f, client.Options{Wait: turnBudget})
	t.Cleanup(func() { close(gate) }) // before Close, which waits for the answer
	for i, a := range missTogether(t, c) {
		if !errors.Is(a.err, &slotv1.Error{Code: slotv1.CodeTimeout}) {
			t.Fatalf("thread %d: %v, %v; want TIMEOUT", i, a.l, a.err)
		}
	}
	if n := f.count("hold"); n != 0 {
		t.Fatalf("%d HOLD requests answered; the threads went on before any answer", n)
	}
}

// TestLocalTurnFirstComeFirstServed: threads that miss wait in arrival
// order: a grant goes to the first waiter, an entry given back to the
// next, and a newcomer queues behind those waiting.
func TestLocalTurnFirstComeFirstServed(t *testing.T) {
	f := newFakeAgent(t, true)
	gate := make(chan struct{})
	f.mu.Lock()
	f.holdGate = gate // one HOLD answered per send
	f.mu.Unlock()
	c := dialFake(t, f, client.Options{Wait: time.Minute})
	t.Cleanup(func() { close(gate) })
	waitIn := func(name string, waiting int) <-chan acquired {
		t.Helper()
		start := make(chan struct{})
		close(start)
		ch := acquireOn(t, c, 250, start)
		waitFor(t, name+" waiting", func() bool { return c.LocalWaiting() == waiting })
		return ch
	}
	a := waitIn("a", 1)
	b := waitIn("b", 2)
	cc := waitIn("c", 3)
	gate <- struct{}{} // the one HOLD answered: a's, the first
	la := await(t, "a", a)
	if la.err != nil {
		t.Fatal(la.err)
	}
	release := func(name string, x acquired) {
		t.Helper()
		if _, err := x.l.Release(slotv1.InvocationOK); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	next := func(name string, ch <-chan acquired, prev acquired) acquired {
		t.Helper()
		x := await(t, name, ch)
		if x.err != nil || x.l.Slot != prev.l.Slot {
			t.Fatalf("%s: %v, %v; want the entry given back (slot %d)", name, x.l, x.err, prev.l.Slot)
		}
		return x
	}
	release("a", la)
	lb := next("b", b, la)
	d := waitIn("d", 2) // behind c
	release("b", lb)
	lc := next("c", cc, lb)
	release("c", lc)
	release("d", next("d", d, lc))
}
