package client_test

import (
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
			f.newSlot(500) // before counting fds: the fake's own
			f.notGrant = true
			f.mu.Unlock()
			c := dialFake(t, f, client.Options{NoLocal: !tc.local})
			onThread(func() {
				before := openFDs(t)
				l, err := c.Acquire(500, "a", "")
				if err == nil || !strings.Contains(err.Error(), "unexpected") {
					t.Errorf("Acquire = %v, %v; want an error naming the unexpected answer", l, err)
				}
				if after := openFDs(t); after != before {
					t.Errorf("%d fds open after the refused answer, %d before: its fds were kept", after, before)
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
			f.newSlot(500)
			f.errorFDs = true
			f.mu.Unlock()
			c := dialFake(t, f, client.Options{NoLocal: !tc.local})
			onThread(func() {
				before := openFDs(t)
				if l, err := c.Acquire(500, "a", ""); err == nil {
					t.Errorf("Acquire = %v; want the agent's error", l)
				}
				if after := openFDs(t); after != before {
					t.Errorf("%d fds open after an ERROR with fds, %d before: its fds were kept", after, before)
				}
			})
		})
	}
}

// openFDs counts the process's open fds.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
