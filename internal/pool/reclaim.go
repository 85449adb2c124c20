package pool

import (
	"log/slog"
	"time"

	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/outcome"
)

// ReleaseOwner releases every lease of a connection that went away.
func (p *Pool) ReleaseOwner(owner Owner) int {
	p.mu.Lock()
	var ids []uint64
	for id, l := range p.leases {
		if l.owner == owner {
			ids = append(ids, id)
		}
	}
	waiting := p.credits[owner] != nil && len(p.credits[owner].pending) > 0
	p.mu.Unlock()
	// What its reports claimed and the agent has not counted yet is
	// settled against its slots' counters before they go.
	if waiting {
		p.settle(owner, time.Now())
	}
	for _, id := range ids {
		_, _ = p.Release(owner, id, outcome.Abandoned)
	}
	p.mu.Lock()
	delete(p.credits, owner)
	p.mu.Unlock()
	return len(ids)
}

// Reclaim re-declares a lease held across a reconnect: the slot is leased
// to owner without any cgroup write (the thread is already in it). It goes
// through admission: beyond the budget only a slot adopted from an earlier
// agent and not leased since is reclaimed (an invocation of before the
// restart may run in it); it is counted, and its quota counts against the
// budget, so it never makes room for more.
func (p *Pool) Reclaim(owner Owner, slotID, quota uint32, t Thread, action string) (*Grant, error) {
	return p.reclaim(owner, slotID, t, action, false)
}

// ReclaimHold re-declares a HOLD lease held across a reconnect, as Reclaim
// does a thread's lease. A process holds at most MaxSlots HOLD leases, also
// after a restart that adopted more slots: a reclaim beyond is refused.
func (p *Pool) ReclaimHold(owner Owner, slotID, quota uint32) (*Grant, error) {
	if !p.GrantsHold() {
		return nil, errorf(BadRequest, "this pool's mode (%s) grants no HOLD leases", p.cfg.Mode)
	}
	return p.reclaim(owner, slotID, Thread{}, "", true)
}

func (p *Pool) reclaim(owner Owner, slotID uint32, t Thread, action string, hold bool) (*Grant, error) {
	p.mu.Lock()
	s := p.slots[slotID]
	if p.closed {
		p.mu.Unlock()
		return nil, errorf(Closing, "pool %s is closing", p.name)
	}
	if s != nil && s.lease != nil && s.lease.owner == owner && !s.busy {
		// The process re-declares a lease it still holds (one of its
		// connections died, others did not): same lease, new id.
		l := s.lease
		delete(p.leases, l.id)
		l.id = leaseSeq.Add(1)
		p.leases[l.id] = l
		return p.reclaimed(s, l)
	}
	if s == nil || s.lease != nil || s.busy {
		p.mu.Unlock()
		return nil, errorf(UnknownLease, "slot %d is unknown or leased to another process", slotID)
	}
	q := s.spec.QuotaMilli
	if hold && p.holdCount[owner] >= p.cfg.MaxSlots {
		p.mu.Unlock()
		p.metrics.Admission(metrics.Rejected)
		return nil, errorf(Rejected, "reclaim of slot %d: the process holds %d HOLD leases, the most a process may (maxSlots)", slotID, p.holdCount[owner])
	}
	if !p.budget.Fits(q) {
		if !s.adopted {
			p.mu.Unlock()
			p.metrics.Admission(metrics.Rejected)
			return nil, errorf(Rejected, "reclaim of slot %d (%dm) does not fit: %dm of %dm budget granted", slotID, q, p.budget.Used(), p.budget.Limit)
		}
		p.metrics.Admission(metrics.ReclaimedOverBudget)
		slog.Warn("reclaim beyond the budget honoured after a restart", "container", p.name, "slot", slotID, "quota", q, "used", p.budget.Used(), "budget", p.budget.Limit)
	}
	l := &lease{id: leaseSeq.Add(1), owner: owner, slot: s, thread: t, want: q, granted: q, action: p.actionLabel(action), start: s.last, hold: hold, seen: s.last, heldUntil: time.Now()}
	s.lease, s.adopted = l, false
	p.leases[l.id] = l
	p.budget.Take(l.granted)
	if hold {
		l.action = outcome.HoldAction
		p.holdCount[owner]++
	} else {
		p.threadLeases[ownerThread{owner, t}] = l
		p.setOccupant(s, t, 0, 0)
	}
	p.metrics.Acquired(string(p.cfg.Mode), outcome.Reclaimed, 0)
	return p.reclaimed(s, l)
}

// reclaimed answers a reclaim; it is called with the lock held and
// releases it. A reclaim sends no fds (the thread sits in the slot already).
func (p *Pool) reclaimed(s *slot, l *lease) (*Grant, error) {
	defer p.mu.Unlock()
	return &Grant{Lease: l.id, SlotID: s.id, Spec: s.spec, Outcome: outcome.AffinityHit, Place: PlaceNone}, nil
}
