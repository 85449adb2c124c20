package pool

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/outcome"
)

// TestRetire: only slots a client placed itself in are exposed. Retiring
// a leased slot ends its lease at once (its holder may keep the process's
// other connections open) and removes it; retiring a free one removes it
// at once. The pool refuses fds for the quarantine, no longer.
func TestRetire(t *testing.T) {
	b := newFake()
	p := start(t, cfg(Affinity, "250m=3"), b)
	ctx := context.Background()
	o := NewOwner()
	placed := req(o, 250, 1, 0)
	placed.AgentPlaces = true
	agentPlaced := must(t)(p.Acquire(ctx, placed))
	held := must(t)(p.Acquire(ctx, holdReq(o, 250)))
	if got := fmt.Sprint(p.Exposed(false)); got != fmt.Sprint([]uint32{held.SlotID}) {
		t.Fatalf("exposed slots %s, want only the HOLD lease's %d (the agent placed %d)", got, held.SlotID, agentPlaced.SlotID)
	}
	if got := fmt.Sprint(p.Exposed(true)); got != fmt.Sprint([]uint32{held.SlotID}) {
		t.Fatalf("exposed slots leased now %s, want %d", got, held.SlotID)
	}
	b.takeOps()
	if !p.Retire(held.SlotID) {
		t.Fatal("a leased slot was not known")
	}
	if ops := fmt.Sprint(b.takeOps()); ops != fmt.Sprintf("[remove %d]", held.SlotID) {
		t.Fatalf("retiring a leased slot: %s", ops)
	}
	if _, err := p.Release(o, held.Lease, outcome.EndOK); err == nil {
		t.Fatal("the retired slot's lease was still held")
	}
	if s := p.Summary(); s.Leases != 1 {
		t.Fatalf("leases after retiring: %+v", s)
	}
	free := p.Exposed(false)
	if len(free) != 0 {
		t.Fatalf("exposed after retiring: %v", free)
	}
	// A free slot goes at once.
	var freeID uint32
	for _, q := range p.snapshotSlots() {
		if q.lease == nil {
			freeID = q.id
		}
	}
	p.Retire(freeID)
	if ops := fmt.Sprint(b.takeOps()); ops != fmt.Sprintf("[remove %d]", freeID) {
		t.Fatalf("retiring a free slot: %s", ops)
	}
	if p.FDsRevoked() {
		t.Fatal("fds refused before any were revoked")
	}
	p.RevokeFDs(time.Now())
	if !p.FDsRevoked() {
		t.Fatal("fds not refused after a revocation")
	}
	if p.fdsRevokedAt(time.Now().Add(fdQuarantine + time.Second)) {
		t.Fatal("fds still refused after the quarantine")
	}
}

// TestRevokeFDsRepeatOffender: a container whose fds are found passed on
// again after its quarantine ended is quarantined twice as long each
// time, up to maxFDQuarantine; findings within one quarantine are one
// incident (the quarantine runs from the last of them).
func TestRevokeFDsRepeatOffender(t *testing.T) {
	p := start(t, cfg(Affinity, "250m=1"), newFake())
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	p.RevokeFDs(t0)
	p.RevokeFDs(at(time.Minute)) // the same incident: another slot of it found
	if !p.fdsRevokedAt(at(fdQuarantine+time.Minute-time.Second)) || p.fdsRevokedAt(at(fdQuarantine+time.Minute+time.Second)) {
		t.Fatalf("one incident: quarantined until %v after the last finding, want %v", time.Duration(p.fdsRevoked.Load()-at(time.Minute).UnixNano()), fdQuarantine)
	}
	// the next incident, after the quarantine ended: twice as long
	second := at(fdQuarantine + 2*time.Minute)
	p.RevokeFDs(second)
	if !p.fdsRevokedAt(second.Add(2*fdQuarantine-time.Second)) || p.fdsRevokedAt(second.Add(2*fdQuarantine+time.Second)) {
		t.Fatalf("second incident: quarantined for %v, want %v", time.Duration(p.fdsRevoked.Load()-second.UnixNano()), 2*fdQuarantine)
	}
	// and so on, never beyond the ceiling
	now := second
	for i := 0; i < 20; i++ {
		now = time.Unix(0, p.fdsRevoked.Load()).Add(time.Second)
		p.RevokeFDs(now)
	}
	if got := time.Duration(p.fdsRevoked.Load() - now.UnixNano()); got != maxFDQuarantine {
		t.Fatalf("after 22 incidents: quarantined for %v, want the ceiling %v", got, maxFDQuarantine)
	}
}
