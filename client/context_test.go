package client_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

// acquireAsync runs AcquireContext on a locked thread of its own.
func acquireAsync(c *client.Client, ctx context.Context) <-chan error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		_, err := c.AcquireContext(ctx, 250, "a", "")
		done <- err
	}()
	return done
}

// waitErr waits for a blocked call's result, failing with why if it does
// not come.
func waitErr(t *testing.T, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return within 30s of its context ending", what)
		return nil
	}
}

// TestAcquireContextCancelsAgentWait: an ACQUIRE the agent holds (queued
// for budget) returns context.Canceled when the context is cancelled, and
// the grant that comes later is released, not kept for the process.
func TestAcquireContextCancelsAgentWait(t *testing.T) {
	f := newFakeAgent(t, false)
	gate := make(chan struct{})
	f.mu.Lock()
	f.acquireGate = gate // under the lock: the race detector sees no order through the socket
	f.mu.Unlock()
	c := dialFake(t, f, client.Options{NoLocal: true})
	ctx, cancel := context.WithCancel(context.Background())
	done := acquireAsync(c, ctx)
	waitFor(t, "the ACQUIRE at the agent", func() bool { return f.count("acquire gated") == 1 })
	cancel()
	if err := waitErr(t, done, "AcquireContext"); !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireContext after cancel: %v, want context.Canceled", err)
	}
	close(gate) // the agent grants after all
	waitFor(t, "the late grant released", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.requests["acquire"] == 1 && len(f.leases) == 0
	})
	// The connection is usable again.
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Release(slotv1.InvocationOK); err != nil {
			t.Fatal(err)
		}
	})
}

// TestAcquireContextDeadline: a deadline caps the wait budget the agent
// gets, and ends the call with context.DeadlineExceeded.
func TestAcquireContextDeadline(t *testing.T) {
	f := newFakeAgent(t, false)
	gate := make(chan struct{})
	defer close(gate)
	f.mu.Lock()
	f.acquireGate = gate // under the lock: the race detector sees no order through the socket
	f.mu.Unlock()
	c := dialFake(t, f, client.Options{NoLocal: true, Wait: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := waitErr(t, acquireAsync(c, ctx), "AcquireContext"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireContext past its deadline: %v, want context.DeadlineExceeded", err)
	}
	f.mu.Lock()
	w := f.waitUS
	f.mu.Unlock()
	if w == 0 || w > 200_000 {
		t.Fatalf("wait budget sent %d us, want at most the 200 ms to the deadline", w)
	}
}

// TestAcquireContextCancelsLocalWait: a thread waiting in the local queue
// for a held slot (its HOLD request on its way) leaves it when the context
// is cancelled; the grant that comes later is published for the next
// acquisition, which needs no request of its own.
func TestAcquireContextCancelsLocalWait(t *testing.T) {
	f := newFakeAgent(t, true)
	gate := make(chan struct{})
	f.mu.Lock()
	f.holdGate = gate
	f.mu.Unlock()
	c := dialFake(t, f, client.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := acquireAsync(c, ctx)
	waitFor(t, "the HOLD request at the agent", func() bool { return f.count("hold gated") == 1 })
	cancel()
	if err := waitErr(t, done, "AcquireContext"); !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireContext after cancel: %v, want context.Canceled", err)
	}
	close(gate)
	onThread(func() {
		deadline := time.Now().Add(30 * time.Second)
		for {
			l, err := c.Acquire(250, "a", "")
			if err != nil {
				t.Fatal(err)
			}
			if !l.Local {
				t.Fatal("not a local lease")
			}
			if _, err := l.Release(slotv1.InvocationOK); err != nil {
				t.Fatal(err)
			}
			if f.count("hold") == 1 || time.Now().After(deadline) {
				break
			}
		}
	})
	if n := f.count("hold"); n != 1 {
		t.Fatalf("%d HOLD requests, want 1: the cancelled waiter's grant was not kept for the next", n)
	}
}

// TestDialContextCancelled: DialContext with an ended context returns its
// error and connects to nothing.
func TestDialContextCancelled(t *testing.T) {
	f := newFakeAgent(t, false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := client.DialContext(ctx, f.path, client.Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("DialContext: %v, want context.Canceled", err)
	}
	if n := f.count("hello"); n != 0 {
		t.Fatalf("%d HELLO sent after cancel", n)
	}
}

// TestSentinelErrors: the client's errors match its exported sentinels.
func TestSentinelErrors(t *testing.T) {
	if _, err := client.Dial(filepath.Join(t.TempDir(), "none.sock"), client.Options{}); !errors.Is(err, client.ErrUnreachable) {
		t.Errorf("Dial of a missing socket: %v, want ErrUnreachable", err)
	}
	f := newFakeAgent(t, false)
	c := dialFake(t, f, client.Options{NoLocal: true})
	var l *client.Lease
	onThread(func() {
		var err error
		if l, err = c.Acquire(250, "a", ""); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := l.Release(slotv1.InvocationOK); err != nil {
		t.Fatal(err)
	}
	c.Close()
	onThread(func() {
		if _, err := c.Acquire(250, "a", ""); !errors.Is(err, client.ErrClosed) {
			t.Errorf("Acquire after Close: %v, want ErrClosed", err)
		}
	})
	lf := newFakeAgent(t, true)
	lcl := dialFake(t, lf, client.Options{})
	onThread(func() {
		l, err := lcl.Acquire(250, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Release(slotv1.InvocationOK); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Release(slotv1.InvocationOK); !errors.Is(err, client.ErrReleased) {
			t.Errorf("second Release: %v, want ErrReleased", err)
		}
	})
}
