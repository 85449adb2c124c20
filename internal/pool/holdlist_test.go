package pool

import (
	"context"
	"fmt"
	"testing"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/outcome"
)

// TestHoldListGiveBackAfterShrink: a limit shrink leaves the HOLD leases
// granted before it above the new budget; HoldList asks each holding process
// for its share of the excess, in proportion to what it holds, until the
// granted total fits again.
func TestHoldListGiveBackAfterShrink(t *testing.T) {
	b := newFake()
	b.limit = 1000
	p := start(t, cfg(Affinity, "250m=4"), b)
	ctx := context.Background()
	a, other := NewOwner(), NewOwner()
	a1 := must(t)(p.Acquire(ctx, holdReq(a, 250)))
	a2 := must(t)(p.Acquire(ctx, holdReq(a, 250)))
	b1 := must(t)(p.Acquire(ctx, holdReq(other, 250)))
	if h := p.HoldList(a, 1024); h.GiveBackMilli != 0 || h.BudgetMilli != 1000 || len(h.Leases) != 2 {
		t.Fatalf("within the budget: %+v", h)
	}
	if h := p.HoldList(NewOwner(), 1024); h.GiveBackMilli != 0 || len(h.Leases) != 0 {
		t.Fatalf("a process without HOLD leases: %+v", h)
	}

	b.limit = 400
	if _, _, err := p.RefreshLimit(); err != nil {
		t.Fatal(err)
	}
	// 750m held, 400m budget: 350m too much; a holds 2/3 of it.
	ha, hb := p.HoldList(a, 1024), p.HoldList(other, 1024)
	if ha.BudgetMilli != 400 || ha.GiveBackMilli != 234 || hb.GiveBackMilli != 117 {
		t.Fatalf("after the shrink: a %+v, b %+v; want 234m and 117m of the 350m excess", ha, hb)
	}
	if got := fmt.Sprint(ha.Leases); got != fmt.Sprintf("[{%d %d 250 false} {%d %d 250 false}]", a1.Lease, a1.SlotID, a2.Lease, a2.SlotID) {
		t.Fatalf("a's leases %s", got)
	}
	if h := p.HoldList(a, 1); len(h.Leases) != 1 {
		t.Fatalf("listed %d leases with max 1", len(h.Leases))
	}
	// a gives one back: 500m held, 100m too much, shared half and half.
	if _, err := p.Release(a, a1.Lease, outcome.EndOK); err != nil {
		t.Fatal(err)
	}
	if ha, hb := p.HoldList(a, 1024), p.HoldList(other, 1024); ha.GiveBackMilli != 50 || hb.GiveBackMilli != 50 {
		t.Fatalf("after one give-back: a %+v, b %+v", ha, hb)
	}
	if _, err := p.Release(other, b1.Lease, outcome.EndOK); err != nil {
		t.Fatal(err)
	}
	if h := p.HoldList(a, 1024); h.GiveBackMilli != 0 {
		t.Fatalf("within the budget again: %+v", h)
	}
}

// TestHoldListShowsRaise: a degraded HOLD lease raised later shows its new
// grant, no longer degraded, in HoldList.
func TestHoldListShowsRaise(t *testing.T) {
	b := newFake()
	b.limit = 500
	c := cfg(Affinity, "250m=1")
	c.Policy = admission.Degrade
	p := start(t, c, b)
	ctx := context.Background()
	o := NewOwner()
	first := must(t)(p.Acquire(ctx, holdReq(o, 250)))
	d := must(t)(p.Acquire(ctx, holdReq(o, 400)))
	if !d.Degraded || d.Spec.QuotaMilli != 250 {
		t.Fatalf("degraded grant %+v", d)
	}
	if h := p.HoldList(o, 1024); fmt.Sprint(h.Leases) != fmt.Sprintf("[{%d %d 250 false} {%d %d 250 true}]", first.Lease, first.SlotID, d.Lease, d.SlotID) {
		t.Fatalf("degraded: %+v", h)
	}
	if _, err := p.Release(o, first.Lease, outcome.EndOK); err != nil {
		t.Fatal(err)
	}
	if h := p.HoldList(o, 1024); fmt.Sprint(h.Leases) != fmt.Sprintf("[{%d %d 400 false}]", d.Lease, d.SlotID) || h.GiveBackMilli != 0 {
		t.Fatalf("raised: %+v", h)
	}
}
