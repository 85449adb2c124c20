package pool

import (
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/metrics"
)

// Release ends a lease and returns what its slot used meanwhile.
func (p *Pool) Release(owner any, id uint64, how metrics.Ending) (cgroup.Usage, error) {
	l, err := p.takeLease(owner, id)
	if err != nil {
		return cgroup.Usage{}, err
	}
	end, used := p.account(l, how)
	r := p.mode.release(p, l)
	if how == metrics.EndPlacementFailed {
		r.vacated = true // the thread never got there
	}
	raises := p.freeSlot(l, end, r)
	p.raise(raises)
	return used, nil
}

// Reported counts what a client says n invocations of action that ended
// how used under its HOLD leases (USAGE): its word, in the series a release
// feeds, through the container's cap on action names like any name.
func (p *Pool) Reported(action string, how metrics.Ending, n uint32, cpuNanos, throttledNanos uint64) {
	p.mu.Lock()
	a := p.actionLabel(action)
	p.mu.Unlock()
	p.metrics.Reported(a, how, n, cpuNanos, throttledNanos)
}

// takeLease removes the owner's lease id from the pool's books and marks
// its slot busy for the release's I/O.
func (p *Pool) takeLease(owner any, id uint64) (*lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.leases[id]
	if l == nil || l.owner != owner {
		p.metrics.Error(metrics.UnknownLease)
		return nil, errorf(UnknownLease, "lease %d is not held by this connection (unknown or already released)", id)
	}
	p.forgetLease(l)
	l.slot.busy = true
	p.beginIO()
	return l, nil
}

// account reads the slot's counters at the end of lease l and counts what
// it used.
func (p *Pool) account(l *lease, how metrics.Ending) (end, used cgroup.Usage) {
	end, err := l.slot.io.Usage()
	if err != nil {
		if p.checkGone(err) == nil {
			p.metrics.Error(metrics.ReadUsage)
		}
		end = l.start
	}
	used = end.Sub(l.start)
	p.metrics.Released(l.action, how, time.Duration(used.CPUNanos), time.Duration(used.ThrottledNanos))
	return end, used
}

// freeSlot returns the lease's slot and budget to the pool, and plans
// raising degraded leases with the budget freed.
func (p *Pool) freeSlot(l *lease, end cgroup.Usage, r released) []raise {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endIO()
	p.budget.Give(l.granted)
	p.dropDegraded(l)
	s := l.slot
	s.lease, s.busy, s.last, s.freeSince = nil, s.raising, end, time.Now()
	if r.vacated && !l.hold && s.occupant == l.thread {
		p.vacate(s)
	}
	if r.removed {
		delete(p.slots, s.id)
	}
	raises := p.planRaises()
	p.broadcast()
	return raises
}

// vacate records that nobody sits in slot s any more.
func (p *Pool) vacate(s *slot) {
	delete(p.byThread, s.occupant)
	s.occupant, s.occupantHost, s.occupantStart = Thread{}, 0, 0
}

// raise is a degraded lease given more budget, whose slot is yet to be
// retuned.
type raise struct {
	l    *lease
	add  uint32
	spec cgroup.Spec
	// done: the lease got all it asked for and left the degraded list.
	done bool
}

// planRaises gives freed budget to degraded leases, oldest first, under the
// lock; raise retunes their slots after. A lease whose slot is busy with
// I/O waits for a later release, and so do the younger ones.
func (p *Pool) planRaises() []raise {
	var out []raise
	for len(p.degraded) > 0 {
		l := p.degraded[0]
		free := p.budget.Free()
		if free == 0 || l.slot.busy || l.slot.raising || l.slot.io == nil {
			break
		}
		r := raise{l: l, add: min(l.want-l.granted, free)}
		r.spec = p.spec(l.granted + r.add)
		p.budget.Take(r.add)
		l.granted += r.add
		l.slot.raising = true
		p.beginIO()
		if l.granted < l.want {
			out = append(out, r)
			break
		}
		r.done = true
		l.degraded = false
		p.degraded = p.degraded[1:]
		out = append(out, r)
	}
	return out
}

// raise retunes the slots of raised leases outside the lock; a retune that
// fails gives the budget back.
func (p *Pool) raise(raises []raise) {
	for _, r := range raises {
		s := r.l.slot
		err := s.io.Retune(r.spec)
		p.mu.Lock()
		s.raising = false
		if s.lease != r.l {
			s.busy = false // released meanwhile: the slot was kept busy for this retune
		}
		switch {
		case err == nil:
			s.spec = r.spec
		case p.leases[r.l.id] == r.l:
			p.metrics.Error(metrics.RetuneFailed)
			p.budget.Give(r.add)
			r.l.granted -= r.add
			if r.done {
				r.l.degraded = true
				p.degraded = append([]*lease{r.l}, p.degraded...)
			}
		default:
			// Released meanwhile: its release gave the budget back.
			p.metrics.Error(metrics.RetuneFailed)
		}
		p.endIO()
		p.broadcast()
		p.mu.Unlock()
	}
}
