package server

import (
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
)

// servingNothing resolves no peer to a container: a connection is charged
// to the node's share.
type servingNothing struct{ Resolver }

func (servingNothing) Serving(string) string { return "" }

// TestAcceptLoopStalled: an accept loop held up with a connection in hand
// (the server's lock never given back) is a stall /healthz names; one
// waiting for connections is not, and neither is it once the lock is back.
func TestAcceptLoopStalled(t *testing.T) {
	h, err := cgroup.Detect()
	if err != nil {
		t.Fatal(err)
	}
	s := New(servingNothing{}, h, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() { ln.Close(); <-done; s.Shutdown() })
	// Stalled is asked an hour ahead: work in hand now has then taken an
	// hour, without the test waiting for it.
	stalled := func() error { return s.Stalled(time.Now().Add(time.Hour), time.Minute) }
	until := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("still not %s after a minute: Stalled says %v", what, stalled())
			}
		}
	}
	until("serving", func() bool { return s.acceptLoops() == 1 })
	if err := stalled(); err != nil {
		t.Fatalf("waiting for connections: %v", err)
	}
	s.mu.Lock()
	var once sync.Once
	unlock := func() { once.Do(s.mu.Unlock) }
	t.Cleanup(unlock) // first: the loop must go on for the listener to close
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	until("stalled", func() bool { return stalled() != nil })
	if err := stalled(); !strings.Contains(err.Error(), "accept loop on "+path+" stalled") {
		t.Errorf("Stalled says %v, want the accept loop named", err)
	}
	unlock()
	until("going again", func() bool { return stalled() == nil })
}

// acceptLoops counts the accept loops serving now.
func (s *Server) acceptLoops() int {
	s.loopsMu.Lock()
	defer s.loopsMu.Unlock()
	return len(s.loops)
}
