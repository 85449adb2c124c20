package client_test

import (
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

// TestCheckAgentLeavesReconnectUnderWay: the background check for a gone
// agent, run while a reconnect is under way (the new agent has not yet
// answered its HELLO), leaves it alone. Before, it saw the client marked
// down, waited for that reconnect to end and then reconnected again: it
// closed the connections just made, and with them the leases re-declared
// or granted there (a lease belongs to its connection; seen as
// UNKNOWN_LEASE and lost leases in TestRestart of internal/agent).
func TestCheckAgentLeavesReconnectUnderWay(t *testing.T) {
	f := newFakeAgent(t, false)
	c := dialFake(t, f, client.Options{ReconnectFor: time.Minute})
	var l *client.Lease
	onThread(func() {
		var err error
		if l, err = c.Acquire(250, "a", ""); err != nil {
			t.Fatal(err)
		}
	})
	gate := make(chan struct{})
	f.mu.Lock()
	f.helloGate = gate
	f.mu.Unlock()
	f.restart()
	// A thread's call finds its connection gone and reconnects; the new
	// agent holds its HELLO.
	acquired := make(chan error, 1)
	go onThread(func() {
		l2, err := c.Acquire(500, "b", "")
		if err == nil {
			_, err = l2.Release(slotv1.InvocationOK)
		}
		acquired <- err
	})
	waitFor(t, "the reconnect's HELLO at the new agent", func() bool { return f.count("hello gated") == 1 })
	checked := make(chan struct{})
	go func() {
		c.CheckAgent()
		close(checked)
	}()
	select {
	case <-checked:
	case <-time.After(time.Minute): // a hang bound only
		close(gate)
		t.Fatal("the agent check waited for the reconnect under way (it would reconnect again after it)")
	}
	close(gate)
	if err := <-acquired; err != nil {
		t.Fatalf("acquire across the restart: %v", err)
	}
	c.CheckAgent() // the agent is there: nothing to do
	if n := f.count("hello"); n != 2 {
		t.Fatalf("%d HELLOs, want 2 (the dial and one reconnect)", n)
	}
	if n := f.count("reclaim"); n != 1 {
		t.Fatalf("%d RECLAIMs, want 1 (the lease held across the restart)", n)
	}
	if _, err := l.Release(slotv1.InvocationOK); err != nil {
		t.Fatalf("releasing the lease re-declared after the restart: %v", err)
	}
}

// TestReconnectKeepsLiveConnections: when one connection hangs up and the
// agent lives on, the reconnect leaves the client's other connections
// open, with the leases they hold. Before, it closed every idle
// connection, and re-declared their leases on a new one while the agent
// still held them for the old: RECLAIM was refused (UNKNOWN_LEASE) and the
// lease lost.
func TestReconnectKeepsLiveConnections(t *testing.T) {
	f := newFakeAgent(t, false)
	c := dialFake(t, f, client.Options{ReconnectFor: time.Minute})
	// Two leases on two connections: both ACQUIREs wait at the agent at
	// once, so the second needs a connection of its own.
	gate := make(chan struct{})
	f.mu.Lock()
	f.acquireGate = gate
	f.mu.Unlock()
	leases := make(chan *client.Lease, 2)
	for q := range 2 {
		go onThread(func() {
			l, err := c.Acquire(uint32(250*(q+1)), "a", "")
			if err != nil {
				t.Error(err)
			}
			leases <- l
		})
		waitFor(t, "the ACQUIRE at the agent", func() bool { return f.count("acquire gated") == q+1 })
	}
	close(gate)
	first, second := <-leases, <-leases
	if first == nil || second == nil {
		t.FailNow()
	}
	// The agent hangs up the connection it accepted second; the client's
	// check finds it and reconnects.
	f.hangUp(1)
	waitFor(t, "a reconnect", func() bool {
		c.CheckAgent()
		return f.count("hello") == 3
	})
	if n := f.count("reclaim"); n != 1 {
		t.Fatalf("%d RECLAIMs, want 1: the lease of the connection that hung up", n)
	}
	// The first ACQUIRE (250m) went on the dial's connection, which stayed.
	held := first
	if held.QuotaMilli != 250 {
		held = second
	}
	if _, err := held.Release(slotv1.InvocationOK); err != nil {
		t.Fatalf("the lease on the connection that stayed open: %v", err)
	}
}

// TestCloseEndsReconnectUnderWay: Close waits for the client's background
// loop, and ends a reconnect the loop has under way (here: waiting for the
// new agent's answer to HELLO) rather than waiting for it.
func TestCloseEndsReconnectUnderWay(t *testing.T) {
	f := newFakeAgent(t, false)
	c, err := client.Dial(f.path, client.Options{ReconnectFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	defer close(gate)
	f.mu.Lock()
	f.helloGate = gate
	f.mu.Unlock()
	f.restart()
	waitFor(t, "the background check's reconnect at the new agent", func() bool { return f.count("hello gated") == 1 })
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(time.Minute): // a hang bound only
		t.Fatal("Close waited for the reconnect under way")
	}
}
