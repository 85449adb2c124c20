package client_test

import (
	"testing"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

// holdListRounds waits until the client asked HOLD_LIST n more times.
func holdListRounds(t *testing.T, f *fakeAgent, n int) {
	t.Helper()
	from := f.count("held")
	waitFor(t, "HOLD_LIST rounds", func() bool { return f.count("held") >= from+n })
}

// holdTwo has two threads hold a 250m slot each at once; the first stays
// in its invocation until release is closed, the second ends at once.
func holdTwo(t *testing.T, c *client.Client, secondBusy bool) (release, second chan struct{}) {
	release, second = make(chan struct{}), make(chan struct{})
	claimed := make(chan *client.Lease, 2)
	run := func(wait chan struct{}) {
		onThread(func() {
			l, err := c.Acquire(250, "a", "")
			if err != nil {
				t.Error(err)
				claimed <- nil
				return
			}
			claimed <- l
			if wait != nil {
				<-wait
			}
			if _, err := l.Release(slotv1.InvocationOK); err != nil {
				t.Error(err)
			}
		})
	}
	go run(release)
	<-claimed
	var w chan struct{}
	if secondBusy {
		w = second
	}
	done := make(chan struct{})
	go func() { run(w); close(done) }()
	<-claimed
	if !secondBusy {
		<-done
	}
	return release, second
}

func ownEntries(c *client.Client) (n int) {
	for i := 0; i < c.Table().Cap(); i++ {
		if c.Table().Entry(i).Slot != 0 {
			n++
		}
	}
	return n
}

// TestLocalGiveBackFree: the container's budget shrank below what the
// process holds: the next HOLD_LIST round gives back a free held slot (not the
// one an invocation runs in), and no more once the rest fits.
func TestLocalGiveBackFree(t *testing.T) {
	f := newFakeAgent(t, true)
	f.setHoldList()
	c := dialFake(t, f, client.Options{})
	release, _ := holdTwo(t, c, false)
	holdListRounds(t, f, 1)
	if r := f.count("release"); r != 0 || ownEntries(c) != 2 {
		t.Fatalf("within an unlimited budget: %d releases, %d entries", r, ownEntries(c))
	}
	f.mu.Lock()
	f.budget = 400
	f.mu.Unlock()
	waitFor(t, "the free held slot given back", func() bool { return f.count("release") == 1 })
	if n := ownEntries(c); n != 1 {
		t.Fatalf("%d entries after the give-back, want 1", n)
	}
	holdListRounds(t, f, 2)
	if r := f.count("release"); r != 1 {
		t.Fatalf("%d releases once 250m of 400m is held, want 1", r)
	}
	close(release) // the running invocation was never disturbed
	waitFor(t, "the invocation's end", func() bool {
		return c.Table().Entry(0).State&0xFFFFFFFF == 0 && c.Table().Entry(1).State&0xFFFFFFFF == 0
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unknownReleases != 0 || len(f.leases) != 1 {
		t.Fatalf("%d unknown releases, %d leases left", f.unknownReleases, len(f.leases))
	}
}

// TestLocalGiveBackBusy: every held slot is in use: one is marked GONE
// (no new claim takes it) and given back once its invocation ended; the
// invocations themselves run on in their slots.
func TestLocalGiveBackBusy(t *testing.T) {
	f := newFakeAgent(t, true)
	f.setHoldList()
	c := dialFake(t, f, client.Options{})
	first, second := holdTwo(t, c, true)
	f.mu.Lock()
	f.budget = 400
	f.mu.Unlock()
	waitFor(t, "a busy entry marked GONE", func() bool {
		for i := 0; i < c.Table().Cap(); i++ {
			if c.Table().Entry(i).Flags&slotv1.EntryGone != 0 {
				return true
			}
		}
		return false
	})
	if r := f.count("release"); r != 0 {
		t.Fatalf("%d releases while both invocations run", r)
	}
	close(first)
	close(second)
	waitFor(t, "the GONE entry given back once free", func() bool { return f.count("release") == 1 })
	holdListRounds(t, f, 2)
	if r, n := f.count("release"), ownEntries(c); r != 1 || n != 1 {
		t.Fatalf("%d releases, %d entries; want 1 and 1", r, n)
	}
	// The slot left is claimed again as usual.
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil || !l.Local {
			t.Fatalf("after the give-back: %v", err)
		}
		l.Release(slotv1.InvocationOK)
	})
	if h := f.count("hold"); h != 2 {
		t.Fatalf("%d HOLD requests, want the 2 of before", h)
	}
}

// TestLocalHoldListRaise: HOLD_LIST_OK carries each lease's current grant: the
// entry of a degraded lease takes the lower quota and DEGRADED, and once
// raised its full quota and no DEGRADED.
func TestLocalHoldListRaise(t *testing.T) {
	f := newFakeAgent(t, true)
	f.setHoldList()
	c := dialFake(t, f, client.Options{})
	var lease uint64
	var slot uint32
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		slot = l.Slot
		l.Release(slotv1.InvocationOK)
	})
	entry := func() slotv1.Entry {
		for i := 0; i < c.Table().Cap(); i++ {
			if e := c.Table().Entry(i); e.Slot == slot {
				return e
			}
		}
		t.Fatal("entry gone")
		return slotv1.Entry{}
	}
	lease = entry().Lease
	f.mu.Lock()
	f.granted, f.degraded = map[uint64]uint32{lease: 200}, map[uint64]bool{lease: true}
	f.mu.Unlock()
	waitFor(t, "the entry degraded to 200m", func() bool {
		e := entry()
		return e.QuotaMilli == 200 && e.Flags&slotv1.EntryDegraded != 0
	})
	f.mu.Lock()
	f.granted, f.degraded = nil, nil
	f.mu.Unlock()
	waitFor(t, "the entry raised to 250m", func() bool {
		e := entry()
		return e.QuotaMilli == 250 && e.Flags&slotv1.EntryDegraded == 0
	})
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil || l.QuotaMilli != 250 || l.Degraded {
			t.Fatalf("after the raise: %+v, %v", l, err)
		}
		l.Release(slotv1.InvocationOK)
	})
}

// TestLocalOldAgentNoHoldList: an agent that did not announce HOLD_LIST (an older
// one) is never sent it; held slots stay until idle as before.
func TestLocalOldAgentNoHoldList(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{})
	onThread(func() {
		l, err := c.Acquire(250, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		l.Release(slotv1.InvocationOK)
	})
	f.mu.Lock()
	f.budget = 100
	f.mu.Unlock()
	// Two rounds of the client's loop (USAGE is sent every round).
	f.burn(1, 1)
	waitFor(t, "two rounds of the background loop", func() bool { return f.count("usage") >= 1 })
	if n, r := f.count("held"), f.count("release"); n != 0 || r != 0 {
		t.Fatalf("%d HOLD_LIST, %d RELEASE to an agent without HOLD_LIST", n, r)
	}
}
