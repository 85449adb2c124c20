package pool

import "sort"

// HoldList is a process's HOLD leases, and how much of their quota it
// should give back: the pool's side of HOLD_LIST (SPEC.md).
type HoldList struct {
	BudgetMilli   uint32
	GiveBackMilli uint32
	Leases        []HoldLease
}

// HoldLease is one HOLD lease and what it is granted now.
type HoldLease struct {
	Lease      uint64
	SlotID     uint32
	QuotaMilli uint32
	Degraded   bool
}

// HoldList reports owner's HOLD leases (at most max, oldest ids first) and its
// share of the container's granted quota above the budget: after a limit
// shrink, leases granted under the old budget keep their share of it until
// they end, and a busy held slot does not end on its own. Each process is
// asked for the excess in proportion to the HOLD quota it holds; thread
// leases end with their invocations.
func (p *Pool) HoldList(owner Owner, max int) HoldList {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := HoldList{BudgetMilli: p.budget.Limit}
	var mine, all uint64
	for _, l := range p.leases {
		if !l.hold {
			continue
		}
		all += uint64(l.granted)
		if l.owner == owner {
			mine += uint64(l.granted)
			h.Leases = append(h.Leases, HoldLease{Lease: l.id, SlotID: l.slot.id, QuotaMilli: l.granted, Degraded: l.degraded})
		}
	}
	sort.Slice(h.Leases, func(i, j int) bool { return h.Leases[i].Lease < h.Leases[j].Lease })
	if len(h.Leases) > max {
		h.Leases = h.Leases[:max]
	}
	used, limit := uint64(p.budget.Used()), uint64(p.budget.Limit)
	if limit > 0 && used > limit && mine > 0 {
		excess := used - limit
		h.GiveBackMilli = uint32(min(mine, (excess*mine+all-1)/all))
	}
	return h
}
