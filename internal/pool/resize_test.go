package pool

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/outcome"
)

// slotsByQuota counts the pool's slots per quota.
func slotsByQuota(p *Pool) map[uint32]int {
	m := map[uint32]int{}
	for _, q := range p.Summary().Quotas {
		if q.Slots > 0 {
			m[q.QuotaMilli] = q.Slots
		}
	}
	return m
}

// TestRefreshLimitFollowsResize: the container's CPU limit changes under
// the pool (an in-place resize). Lowered below a slot's quota: requests
// above it are refused, the budget shrinks, the free slot above it is
// removed at the next reap and the leased one once it is released.
// Raised again: the budget grows and the pre-warmed slots are made anew.
func TestRefreshLimitFollowsResize(t *testing.T) {
	b := newFake()
	b.limit = 1000
	p := start(t, cfg(Affinity, "250m=1,500m=2"), b)
	o := NewOwner()
	ctx := context.Background()
	held := must(t)(p.Acquire(ctx, req(o, 500, 1, 0)))
	freed := must(t)(p.Acquire(ctx, req(o, 500, 2, 0)))
	if _, err := p.Release(o, freed.Lease, outcome.EndOK); err != nil {
		t.Fatal(err)
	}
	if before, now, err := p.RefreshLimit(); err != nil || before != 1000 || now != 1000 {
		t.Fatalf("unchanged limit: %d -> %d, %v", before, now, err)
	}
	b.takeOps()

	b.limit = 400
	if before, now, err := p.RefreshLimit(); err != nil || before != 1000 || now != 400 {
		t.Fatalf("lowered limit: %d -> %d, %v", before, now, err)
	}
	if _, err := p.Acquire(ctx, req(o, 500, 3, 0)); !errors.Is(err, ErrInvalidQuota) {
		t.Fatalf("500m under a 400m limit: %v, want INVALID_QUOTA", err)
	}
	if s := p.Summary(); s.BudgetMilli != 400 || s.UsedMilli != 500 {
		t.Fatalf("budget after the shrink: %dm, %dm used; want 400m, the held 500m lease still counted", s.BudgetMilli, s.UsedMilli)
	}
	if n := p.Reap(time.Now()); n != 1 {
		t.Fatalf("reaped %d, want the free 500m slot", n)
	}
	if ops := b.takeOps(); fmt.Sprint(ops) != fmt.Sprintf("[remove %d]", freed.SlotID) {
		t.Fatalf("reap: %v", ops)
	}
	// The held 500m lease keeps its slot until it is released.
	if got := slotsByQuota(p); got[500] != 1 {
		t.Fatalf("slots %v: the leased 500m slot went while leased", got)
	}
	if _, err := p.Release(o, held.Lease, outcome.EndOK); err != nil {
		t.Fatal(err)
	}
	if n := p.Reap(time.Now()); n != 1 {
		t.Fatalf("reaped %d after the release, want the other 500m slot", n)
	}
	if got := slotsByQuota(p); fmt.Sprint(got) != "map[250:1]" {
		t.Fatalf("slots under 400m: %v, want the 250m one", got)
	}
	g := must(t)(p.Acquire(ctx, req(o, 250, 3, 0)))
	p.Release(o, g.Lease, outcome.EndOK)

	b.limit = 1000
	if before, now, err := p.RefreshLimit(); err != nil || before != 400 || now != 1000 {
		t.Fatalf("raised limit: %d -> %d, %v", before, now, err)
	}
	if got := slotsByQuota(p); fmt.Sprint(got) != "map[250:1 500:2]" {
		t.Fatalf("slots under 1000m again: %v, want the prewarm 250m=1,500m=2", got)
	}
	if s := p.Summary(); s.BudgetMilli != 1000 {
		t.Fatalf("budget after the growth: %dm", s.BudgetMilli)
	}
	must(t)(p.Acquire(ctx, req(o, 500, 4, 0)))
	if n := p.Reap(time.Now()); n != 0 {
		t.Fatalf("reaped %d slots within the limit", n)
	}
}

// TestRefreshLimitRefusesWaitingRequest: a request queued for budget is
// refused once the limit falls below its quota, instead of waiting out
// its budget for a slot it can no longer get.
func TestRefreshLimitRefusesWaitingRequest(t *testing.T) {
	b := newFake()
	b.limit = 500
	p := start(t, cfg(Affinity, "500m=2"), b)
	o := NewOwner()
	ctx := context.Background()
	must(t)(p.Acquire(ctx, req(o, 500, 1, 0)))
	done := make(chan error, 1)
	go func() {
		r := req(o, 500, 2, 0)
		r.Wait = 10 * time.Second
		_, err := p.Acquire(ctx, r)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // let it queue
	b.limit = 300
	if _, _, err := p.RefreshLimit(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrRejected) {
			t.Fatalf("queued 500m request after the limit fell to 300m: %v, want REJECTED", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the queued request still waits 5 s after the limit fell below its quota")
	}
}

// TestAskLimitBeforeTheKernel: the orchestrator asks for a lower limit
// before the cgroup has it (cgroup v1 refuses a container quota below a
// slot's, so the slot must go first): the free slot above it goes at
// once. Asked higher again, the pool still serves within the cgroup's
// limit until the cgroup has the new one.
func TestAskLimitBeforeTheKernel(t *testing.T) {
	b := newFake()
	b.limit = 1000
	p := start(t, cfg(Affinity, "250m=1,500m=1"), b)
	ctx := context.Background()
	if err := p.AskLimit(400); err != nil {
		t.Fatal(err)
	}
	if got := slotsByQuota(p); fmt.Sprint(got) != "map[250:1]" {
		t.Fatalf("asked 400m: slots %v, want the 500m one removed at once", got)
	}
	if _, err := p.Acquire(ctx, req(NewOwner(), 500, 1, 0)); !errors.Is(err, ErrInvalidQuota) {
		t.Fatalf("500m with 400m asked: %v", err)
	}
	b.limit = 400 // the kubelet applied it
	if _, _, err := p.RefreshLimit(); err != nil {
		t.Fatal(err)
	}
	if err := p.AskLimit(1000); err != nil {
		t.Fatal(err)
	}
	if got := slotsByQuota(p); fmt.Sprint(got) != "map[250:1]" {
		t.Fatalf("asked 1000m, cgroup still 400m: slots %v", got)
	}
	if s := p.Summary(); s.BudgetMilli != 400 {
		t.Fatalf("budget %dm before the cgroup grew", s.BudgetMilli)
	}
	b.limit = 1000
	if _, _, err := p.RefreshLimit(); err != nil {
		t.Fatal(err)
	}
	if got := slotsByQuota(p); fmt.Sprint(got) != "map[250:1 500:1]" {
		t.Fatalf("cgroup 1000m: slots %v", got)
	}
	// No limit asked (the spec lost its limit): the cgroup's rules.
	if err := p.AskLimit(0); err != nil {
		t.Fatal(err)
	}
	if s := p.Summary(); s.BudgetMilli != 1000 {
		t.Fatalf("budget %dm with no limit asked", s.BudgetMilli)
	}
}
