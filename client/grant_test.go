package client_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cpuslot/cpuslot/client"
)

// TestAcquireAnswerNotAGrant: an answer to ACQUIRE that is no grant fails
// the acquisition on both paths (the thread's own lease and a HOLD lease
// on a miss), and the fds that came with it are closed, not cached.
func TestAcquireAnswerNotAGrant(t *testing.T) {
	for _, tc := range []struct {
		name    string
		local   bool
		request string
	}{{"thread", false, "acquire"}, {"hold", true, "hold"}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAgent(t, tc.local)
			f.mu.Lock()
			s1 := f.newSlot(500)
			f.notGrant = true
			f.mu.Unlock()
			c := dialFake(t, f, client.Options{NoLocal: !tc.local})
			onThread(func() {
				before := copiesOf(t, s1.placeW)
				l, err := c.Acquire(500, "a", "")
				if err == nil || !strings.Contains(err.Error(), "unexpected") {
					t.Errorf("Acquire = %v, %v; want an error naming the unexpected answer", l, err)
				}
				if after := copiesOf(t, s1.placeW); after != before {
					t.Errorf("%d fds of the slot's files open after the refused answer, %d before: its fds were kept", after, before)
				}
			})
			if n := f.count(tc.request); n != 1 {
				t.Errorf("%d %s requests reached the agent, want 1", n, tc.request)
			}
		})
	}
}

// TestAcquireErrorWithFDs: fds that come with an ERROR answer (a buggy or
// hostile agent) are closed, on both request paths, not kept open.
func TestAcquireErrorWithFDs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		local bool
	}{{"thread", false}, {"hold", true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAgent(t, tc.local)
			f.mu.Lock()
			s1 := f.newSlot(500)
			f.errorFDs = true
			f.mu.Unlock()
			c := dialFake(t, f, client.Options{NoLocal: !tc.local})
			onThread(func() {
				before := copiesOf(t, s1.placeW)
				if l, err := c.Acquire(500, "a", ""); err == nil {
					t.Errorf("Acquire = %v; want the agent's error", l)
				}
				if after := copiesOf(t, s1.placeW); after != before {
					t.Errorf("%d fds of the slot's files open after an ERROR with fds, %d before: its fds were kept", after, before)
				}
			})
		})
	}
}

// copiesOf counts this process's fds open on the same files as fs (the fake
// agent runs in the test's process, so its own fds count too): fds the
// client received and kept raise it, while fds that other tests' goroutines
// close meanwhile do not change it. A slot's placement pipe has a target of
// its own (pipe:[inode]); its cpu.stat memfd's name is every slot's.
func copiesOf(t *testing.T, fs ...*os.File) int {
	t.Helper()
	targets := map[string]bool{}
	for _, f := range fs {
		l, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		targets[l] = true
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && targets[l] {
			n++
		}
	}
	return n
}
