package client_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

func (f *fakeAgent) sleepWakesSent() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.sleepWakes, ", ")
}

func lendingFake(t *testing.T, local, lend bool) *fakeAgent {
	f := newFakeAgent(t, local)
	f.mu.Lock()
	f.lend = lend
	f.mu.Unlock()
	return f
}

// TestSleepWakeThreadLease: SLEEP and WAKE name the lease and release
// nothing; the lease's RELEASE follows.
func TestSleepWakeThreadLease(t *testing.T) {
	f := lendingFake(t, false, true)
	c := dialFake(t, f, client.Options{NoLocal: true})
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Sleep(); err != nil {
			t.Fatal(err)
		}
		if err := l.Wake(); err != nil {
			t.Fatal(err)
		}
		if got, want := f.sleepWakesSent(), fmt.Sprintf("sleep %d, wake %d", 101, 101); got != want {
			t.Fatalf("sent %q, want %q", got, want)
		}
		if n := f.count("release"); n != 0 {
			t.Fatalf("%d RELEASEs before the lease's own", n)
		}
		if _, err := l.Release(slotv1.InvocationOK); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSleepWithoutLend: an agent that did not say LEND is sent nothing (an
// older one would release the lease).
func TestSleepWithoutLend(t *testing.T) {
	f := lendingFake(t, false, false)
	c := dialFake(t, f, client.Options{NoLocal: true})
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Sleep(); err != nil {
			t.Fatal(err)
		}
		if err := l.Wake(); err != nil {
			t.Fatal(err)
		}
		if got := f.sleepWakesSent(); got != "" || f.count("release") != 0 {
			t.Fatalf("sent %q and %d RELEASEs without LEND", got, f.count("release"))
		}
		l.Release(slotv1.InvocationOK)
	})
}

// TestSleepLocalLease: a local lease sleeps through its slot's HOLD lease,
// and its release while asleep wakes that lease first, so that the next
// invocation in the held slot is not charged as sleeping.
func TestSleepLocalLease(t *testing.T) {
	f := lendingFake(t, true, true)
	c := dialFake(t, f, client.Options{})
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		if !l.Local {
			t.Fatal("not a local lease")
		}
		if err := l.Sleep(); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Release(slotv1.InvocationOK); err != nil {
			t.Fatal(err)
		}
		if got, want := f.sleepWakesSent(), "sleep 101, wake 101"; got != want {
			t.Fatalf("sent %q, want %q", got, want)
		}
		if err := l.Sleep(); err == nil {
			t.Fatal("a released local lease slept")
		}
	})
}

// TestSleepRefused: a SLEEP the agent refuses (its rate) is a typed error,
// and the lease counts as awake: its release sends no WAKE.
func TestSleepRefused(t *testing.T) {
	f := lendingFake(t, true, true)
	f.mu.Lock()
	f.refuseSleep = true
	f.mu.Unlock()
	c := dialFake(t, f, client.Options{})
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		var pe *slotv1.Error
		if err := l.Sleep(); !errors.As(err, &pe) || pe.Code != slotv1.CodeRejected {
			t.Fatalf("refused SLEEP: %v, want REJECTED", err)
		}
		if _, err := l.Release(slotv1.InvocationOK); err != nil {
			t.Fatal(err)
		}
		if got, want := f.sleepWakesSent(), "sleep 101"; got != want {
			t.Fatalf("sent %q, want %q", got, want)
		}
	})
}
