package pool

import (
	"context"
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
	h := cgrouptest.Hierarchy(t)
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
		_, err := p.Acquire(context.Background(), req(&conn{}, 250, 1, 0))
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
