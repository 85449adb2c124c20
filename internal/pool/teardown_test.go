package pool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
)

// gatedBackend holds CreateSlot until the test opens the gate.
type gatedBackend struct {
	Backend
	entered, gate chan struct{}
}

func (b gatedBackend) CreateSlot(id uint32, spec cgroup.Spec) (SlotIO, error) {
	b.entered <- struct{}{}
	<-b.gate
	return b.Backend.CreateSlot(id, spec)
}

// TestCloseWaitsForCreation (issue item 8): a pool torn down while an
// acquisition creates a slot leaves no slot directory behind.
func TestCloseWaitsForCreation(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	c, err := h.Container(rel, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := gatedBackend{Backend: CgroupBackend(c), entered: make(chan struct{}), gate: make(chan struct{})}
	p, err := New("race", cfg(Affinity, ""), b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	acquired := make(chan error, 1)
	go func() {
		_, err := p.Acquire(context.Background(), req(NewOwner(), 250, 1, 0))
		acquired <- err
	}()
	<-b.entered // the acquisition is creating a slot
	closed := make(chan error, 1)
	go func() { closed <- p.Close(true) }()
	// Close has begun once the pool refuses new requests.
	waitClosed(t, p)
	close(b.gate)
	if err := <-closed; err != nil {
		t.Errorf("close: %v", err)
	}
	<-acquired
	if left := cgrouptest.Leftovers(h, rel); len(left) != 0 {
		t.Fatalf("teardown during creation left %v", left)
	}
}

func waitClosed(t *testing.T, p *Pool) {
	t.Helper()
	for {
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return
		}
	}
}

// TestRemovedContainerMakesPoolStale (issue item 9): the container's cgroup
// is removed and made anew at the same path behind the pool's back. The
// pool fails its next placement as stale (the client reconnects and gets a
// fresh pool) and never touches the new cgroup.
func TestRemovedContainerMakesPoolStale(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	c, err := h.Container(rel, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New("stale", cfg(CacheEager, "250m=1"), CgroupBackend(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	roots := []string{h.CPURoot}
	if h.AcctRoot != "" {
		roots = append(roots, h.AcctRoot)
	}
	for _, r := range roots {
		for _, d := range []string{filepath.Join(r, rel, cgroup.SlotName(1)), filepath.Join(r, rel)} {
			if err := syscall.Rmdir(d); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Mkdir(filepath.Join(r, rel), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self := os.Getpid()
	for _, q := range []uint32{250, 500} { // a cached slot, then a new one
		r := req(NewOwner(), q, 1, 0)
		r.HostTID = func() (int, error) { return self, nil }
		if _, err := p.Acquire(context.Background(), r); !errors.Is(err, ErrClosing) {
			t.Errorf("acquire %dm in a removed container: %v, want SHUTTING_DOWN", q, err)
		}
	}
	if !p.Stale() {
		t.Error("pool not stale")
	}
	if left := cgrouptest.Leftovers(h, rel); len(left) != 0 {
		t.Errorf("the stale pool made %v in the new cgroup", left)
	}
	if err := p.Close(true); err != nil {
		t.Errorf("closing a stale pool: %v", err)
	}
}
