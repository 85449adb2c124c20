package pool

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// fakeBackend records cgroup operations so tests can count writes. It is a
// unit-test stand-in only; the real kernel is exercised by the integration
// tests in internal/server and internal/cgroup.
type fakeBackend struct {
	mu         sync.Mutex
	slots      map[uint32]*fakeSlot
	adopt      map[uint32]cgroup.Spec
	limit      uint32
	maxSlots   int // refuse mkdir beyond this many (0: no bound)
	ops        []string
	unprepared bool
	closed     bool
	// onIO, when set, runs at each cgroup operation.
	onIO func(op string)
	// failRetune makes every retune fail (the slot keeps its old quota).
	failRetune bool
}

type fakeSlot struct {
	b       *fakeBackend
	id      uint32
	spec    cgroup.Spec
	cpu     uint64
	removed bool
	busy    int // Remove fails with ErrBusy this many times
}

func newFake() *fakeBackend { return &fakeBackend{slots: map[uint32]*fakeSlot{}} }

func (b *fakeBackend) op(format string, args ...any) {
	if b.onIO != nil {
		b.onIO(format)
	}
	b.mu.Lock()
	b.ops = append(b.ops, fmt.Sprintf(format, args...))
	b.mu.Unlock()
}

func (b *fakeBackend) takeOps() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.ops
	b.ops = nil
	return o
}

func (b *fakeBackend) CreateSlot(id uint32, spec cgroup.Spec) (SlotIO, error) {
	b.mu.Lock()
	live := 0
	for _, s := range b.slots {
		if !s.removed {
			live++
		}
	}
	b.mu.Unlock()
	if b.maxSlots > 0 && live >= b.maxSlots {
		return nil, fmt.Errorf("mkdir: %w", cgroup.ErrLimitReached)
	}
	b.op("create %d %dm", id, spec.QuotaMilli)
	s := &fakeSlot{b: b, id: id, spec: spec}
	b.mu.Lock()
	b.slots[id] = s
	b.mu.Unlock()
	return s, nil
}

func (b *fakeBackend) AdoptSlots() (map[uint32]SlotIO, error) {
	out := map[uint32]SlotIO{}
	for id, spec := range b.adopt {
		s := &fakeSlot{b: b, id: id, spec: spec}
		b.slots[id] = s
		out[id] = s
	}
	return out, nil
}

func (b *fakeBackend) MoveOut(tid int) error       { b.op("moveout %d", tid); return nil }
func (b *fakeBackend) LimitMilli() (uint32, error) { return b.limit, nil }
func (b *fakeBackend) Unprepare() error            { b.unprepared = true; return nil }
func (b *fakeBackend) Close()                      { b.closed = true }

func init() {
	// Fake threads never end: a TID keeps its start time.
	threadStart = func(tid int) (uint64, error) { return uint64(tid), nil }
}

func (s *fakeSlot) OpenFDs() ([]int, error) { return nil, nil }
func (s *fakeSlot) Spec() cgroup.Spec       { return s.spec }
func (s *fakeSlot) Place(tid int) error     { s.b.op("place %d %d", s.id, tid); return nil }
func (s *fakeSlot) Retune(sp cgroup.Spec) error {
	s.b.op("retune %d %dm", s.id, sp.QuotaMilli)
	s.b.mu.Lock()
	fail := s.b.failRetune
	s.b.mu.Unlock()
	if fail {
		return errors.New("fake: retune refused")
	}
	s.spec = sp
	return nil
}
func (s *fakeSlot) Usage() (cgroup.Usage, error) {
	if s.b.onIO != nil {
		s.b.onIO("usage")
	}
	s.cpu += 1000
	return cgroup.Usage{CPUNanos: s.cpu}, nil
}
func (s *fakeSlot) Remove() error {
	if s.busy > 0 {
		s.busy--
		return fmt.Errorf("rmdir: %w", cgroup.ErrBusy)
	}
	s.b.op("remove %d", s.id)
	s.removed = true
	return nil
}
func (s *fakeSlot) Close() {}

func cfg(mode Mode, prewarm string) settings.Pool {
	c := settings.Default()
	c.Mode = mode
	c.Prewarm, _ = ParsePrewarm(prewarm)
	c.DefaultWait = 50 * time.Millisecond
	return c
}

func start(t *testing.T, c settings.Pool, b *fakeBackend) *Pool {
	t.Helper()
	p, err := New("test", c, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	b.takeOps()
	return p
}

func req(owner Owner, q uint32, tid uint32, cur uint32) Request {
	return Request{Owner: owner, QuotaMilli: q, Thread: Thread{NS: 1, TID: tid}, CurrentSlot: cur,
		HostTID: func() (int, error) { return int(tid) + 10000, nil }}
}

func must(t *testing.T) func(*Grant, error) *Grant {
	return func(g *Grant, err error) *Grant {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
}
