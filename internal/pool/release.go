package pool

import (
	"sort"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/outcome"
)

// Release ends a lease and returns what its slot used meanwhile.
func (p *Pool) Release(owner Owner, id uint64, how outcome.Ending) (cgroup.Usage, error) {
	l, err := p.takeLease(owner, id)
	if err != nil {
		return cgroup.Usage{}, err
	}
	end, used := p.account(l, how)
	r := p.mode.release(p, l)
	if how == outcome.EndPlacementFailed {
		r.vacated = true // the thread never got there
	}
	raises, retired := p.freeSlot(l, end, r)
	p.raise(raises)
	if retired {
		p.removeRetired(l.slot)
	}
	return used, nil
}

// Report is what a client says N invocations of Action that ended How used
// under its HOLD leases (one USAGE record).
type Report struct {
	Action         string
	How            outcome.Ending
	N              uint64
	CPUNanos       uint64
	ThrottledNanos uint64
}

// credit is what a process's HOLD leases used, as the agent read it from
// their slots' counters, that its reports have not claimed yet. How a
// process splits its CPU among its actions is its word; the total it
// reports cannot exceed what its slots used, nor its invocations what its
// slots could have run (minInvocation).
type credit struct {
	cpu, throttled uint64
	// invocations is how many more invocations its reports may claim.
	invocations uint64
	// observed is when the slots' counters were last read for the process.
	observed time.Time
	// pending holds what reports claimed since then, by action and ending
	// (as many keys as the container's action names allow).
	pending map[reportKey]*Report
	// settleArmed: a timer will count pending once observeEvery has passed.
	settleArmed bool
}

type reportKey struct {
	action string
	how    outcome.Ending
}

// minInvocation is the least slot time the agent believes one reported
// invocation took. A held slot runs one invocation at a time (the slot
// table leases an entry to one thread), and none takes less than a
// microsecond, so a process is credited at most one invocation per
// microsecond its HOLD leases were held: a bound on what a report can
// inflate (10^6 a second per held slot, none without one), far above any
// honest count.
const minInvocation = time.Microsecond

// observeEvery bounds how often a process's reports have the agent read
// its held slots' counters: a process holding n slots costs n reads per
// observeEvery however many USAGE frames it sends. Clients send one a
// second; what comes sooner waits for the next read, at most observeEvery.
const observeEvery = time.Second

// Reported takes a process's USAGE records. They are counted in the series
// a release feeds, through the container's cap on action names like any
// name, each record's times cut to what the process's held slots used and
// no earlier record claimed. Records that come within observeEvery of the
// last read wait for the next one: the next report, a timer set for when
// observeEvery has passed (one per process), or the process leaving. It
// returns the records counted now.
func (p *Pool) Reported(owner Owner, rs []Report) []Report {
	return p.report(owner, rs, time.Now())
}

func (p *Pool) report(owner Owner, rs []Report, now time.Time) []Report {
	p.mu.Lock()
	c := p.creditOf(owner)
	if c.pending == nil {
		c.pending = map[reportKey]*Report{}
	}
	if p.holdCount[owner] == 0 && c.invocations == 0 && len(rs) > 0 {
		// It holds no slot and has nothing left to claim: nothing of
		// these records could be credited, and they take no action name.
		rs = nil
		p.metrics.Error(metrics.UsageOverclaimed)
	}
	for _, r := range rs {
		r.Action = p.actionLabel(r.Action)
		k := reportKey{r.Action, r.How}
		if q := c.pending[k]; q != nil {
			q.N = satAdd(q.N, r.N)
			q.CPUNanos, q.ThrottledNanos = satAdd(q.CPUNanos, r.CPUNanos), satAdd(q.ThrottledNanos, r.ThrottledNanos)
		} else {
			c.pending[k] = &r
		}
	}
	due := now.Sub(c.observed) >= observeEvery
	if !due && len(c.pending) > 0 && !c.settleArmed {
		c.settleArmed = true
		time.AfterFunc(observeEvery-now.Sub(c.observed), func() { p.settleLater(owner) })
	}
	p.mu.Unlock()
	if !due {
		return nil
	}
	return p.settle(owner, now)
}

// settleLater counts what a process's reports left waiting once
// observeEvery has passed since the last read, so the agent's series
// follow its reports within a second, not a maintenance round.
func (p *Pool) settleLater(owner Owner) {
	p.mu.Lock()
	c, ok := p.credits[owner]
	if !ok {
		p.mu.Unlock()
		return
	}
	c.settleArmed = false
	if len(c.pending) == 0 {
		p.mu.Unlock()
		return
	}
	if wait := observeEvery - time.Since(c.observed); wait > 0 {
		c.settleArmed = true
		time.AfterFunc(wait, func() { p.settleLater(owner) })
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.settle(owner, time.Now())
}

// settle reads the owner's held slots' counters and counts its pending
// records against what they used and the time they were held.
func (p *Pool) settle(owner Owner, now time.Time) []Report {
	p.observeHolds(owner, now)
	p.mu.Lock()
	c := p.creditOf(owner)
	c.observed = now
	out := make([]Report, 0, len(c.pending))
	for _, r := range c.pending {
		out = append(out, *r)
	}
	c.pending = nil
	if p.closed {
		// Its container is no longer served: its series are gone.
		p.mu.Unlock()
		return nil
	}
	// Cut in a fixed order, so which record a short credit falls on does
	// not depend on map order.
	sort.Slice(out, func(i, j int) bool {
		if out[i].Action != out[j].Action {
			return out[i].Action < out[j].Action
		}
		return out[i].How < out[j].How
	})
	over := false
	kept := out[:0]
	for _, r := range out {
		cpu, thr, n := min(r.CPUNanos, c.cpu), min(r.ThrottledNanos, c.throttled), min(r.N, c.invocations)
		over = over || cpu < r.CPUNanos || thr < r.ThrottledNanos || n < r.N
		c.cpu, c.throttled, c.invocations = c.cpu-cpu, c.throttled-thr, c.invocations-n
		r.CPUNanos, r.ThrottledNanos, r.N = cpu, thr, n
		if n > 0 || cpu > 0 || thr > 0 {
			kept = append(kept, r) // a record cut to nothing makes no series
		}
	}
	p.mu.Unlock()
	if over {
		p.metrics.Error(metrics.UsageOverclaimed)
	}
	for _, r := range kept {
		p.metrics.Reported(p.name, r.Action, r.How, r.N, r.CPUNanos, r.ThrottledNanos)
	}
	return kept
}

// settleDue settles the records that have waited observeEvery.
func (p *Pool) settleDue(now time.Time) {
	p.mu.Lock()
	var due []Owner
	for owner, c := range p.credits {
		if len(c.pending) > 0 && now.Sub(c.observed) >= observeEvery {
			due = append(due, owner)
		}
	}
	p.mu.Unlock()
	for _, owner := range due {
		p.settle(owner, now)
	}
}

// observeHolds credits the owner with what its HOLD leases' slots used
// since last seen, and with the time they were held until now. The
// counters are read outside the lock.
func (p *Pool) observeHolds(owner Owner, now time.Time) {
	p.mu.Lock()
	var ls []*lease
	for _, l := range p.leases {
		if l.owner == owner && l.hold {
			p.creditHeld(l, now)
			if l.slot.io != nil {
				ls = append(ls, l)
			}
		}
	}
	p.mu.Unlock()
	us := make([]cgroup.Usage, len(ls))
	read := make([]bool, len(ls))
	for i, l := range ls {
		u, err := l.slot.io.Usage()
		us[i], read[i] = u, err == nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, l := range ls {
		if read[i] && p.leases[l.id] == l {
			p.credit(l, us[i])
		}
	}
}

// credit adds what l's slot used up to u to its owner's credit. The
// caller holds the lock.
func (p *Pool) credit(l *lease, u cgroup.Usage) {
	if u.CPUNanos < l.seen.CPUNanos {
		return // an older read than one already credited
	}
	d := u.Sub(l.seen)
	c := p.creditOf(l.owner)
	c.cpu, c.throttled = satAdd(c.cpu, d.CPUNanos), satAdd(c.throttled, d.ThrottledNanos)
	l.seen = u
}

// creditHeld adds the invocations the time l was held until now allows to
// its owner's credit. The caller holds the lock.
func (p *Pool) creditHeld(l *lease, now time.Time) {
	if !now.After(l.heldUntil) {
		return
	}
	c := p.creditOf(l.owner)
	c.invocations = satAdd(c.invocations, uint64(now.Sub(l.heldUntil)/minInvocation))
	l.heldUntil = now
}

func (p *Pool) creditOf(owner Owner) *credit {
	c := p.credits[owner]
	if c == nil {
		c = &credit{}
		p.credits[owner] = c
	}
	return c
}

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}

// takeLease removes the owner's lease id from the pool's books and marks
// its slot busy for the release's I/O.
func (p *Pool) takeLease(owner Owner, id uint64) (*lease, error) {
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
func (p *Pool) account(l *lease, how outcome.Ending) (end, used cgroup.Usage) {
	end, err := l.slot.io.Usage()
	if err != nil {
		if p.checkGone(err) == nil {
			p.metrics.Error(metrics.ReadUsage)
		}
		end = l.start
	}
	used = end.Sub(l.start)
	if l.hold {
		// Its invocations' CPU is counted as the process reports it
		// (Reported), up to what the slot used: counted here as well, it
		// would count twice.
		p.mu.Lock()
		p.credit(l, end)
		p.creditHeld(l, time.Now())
		p.mu.Unlock()
		p.metrics.Released(p.name, l.action, how, 0, 0)
		return end, used
	}
	p.metrics.Released(p.name, l.action, how, time.Duration(used.CPUNanos), time.Duration(used.ThrottledNanos))
	return end, used
}

// freeSlot returns the lease's slot and budget to the pool, and plans
// raising degraded leases with the budget freed. A retired slot is left
// busy for the caller to remove (retired).
func (p *Pool) freeSlot(l *lease, end cgroup.Usage, r released) (_ []raise, retired bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endIO()
	p.endSleep(l)
	p.budget.Give(l.charged())
	p.dropDegraded(l)
	s := l.slot
	s.lease, s.busy, s.last, s.freeSince = nil, s.raising, end, time.Now()
	if r.vacated && !l.hold && s.occupant == l.thread {
		p.vacate(s)
	}
	if r.removed {
		delete(p.slots, s.id)
	} else if s.retired && !s.busy {
		s.busy, retired = true, true
		p.beginIO()
	}
	raises := p.planRaises()
	p.broadcast()
	return raises, retired
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
// I/O waits for a later release, and so do the younger ones. A sleeping
// lease is passed over: it runs nothing with a raise, and what it would be
// charged no one could use until it wakes (Wake raises it then).
func (p *Pool) planRaises() []raise {
	var out []raise
	keep := p.degraded[:0:0]
	i := 0
	for ; i < len(p.degraded); i++ {
		l := p.degraded[i]
		if l.sleeping {
			keep = append(keep, l)
			continue
		}
		if l.granted >= l.want {
			l.degraded = false // nothing to raise (a raise of 0 would retune for nothing)
			continue
		}
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
		r.done = l.granted == l.want
		out = append(out, r)
		if !r.done {
			keep = append(keep, l)
			i++
			break
		}
		l.degraded = false
	}
	p.degraded = append(keep, p.degraded[i:]...)
	return out
}

// raise retunes the slots of raised leases outside the lock; a retune that
// fails gives the budget back. Each write may free the way for more raises
// (retune plans them): they join the queue, so a chain of raises is a loop.
func (p *Pool) raise(raises []raise) {
	for len(raises) > 0 {
		r := raises[0]
		raises = append(raises[1:], p.retune(r.l, r.spec, func() {
			p.budget.Give(r.add)
			r.l.granted -= r.add
			p.clampLent(r.l)
			if r.done {
				r.l.degraded = true
				p.degraded = append([]*lease{r.l}, p.degraded...)
			}
		})...)
	}
}

// retune writes lease l's slot to spec outside the lock (the caller marked
// the slot raising and began the I/O). A retune that fails while l still
// holds its slot runs undo under the lock; one whose lease was released
// meanwhile needs nothing undone: its release settled the budget. It
// returns the raises of the degraded leases the write held up, planned
// under the lock, for the caller to write.
func (p *Pool) retune(l *lease, spec cgroup.Spec, undo func()) []raise {
	s := l.slot
	err := s.io.Retune(spec)
	p.mu.Lock()
	s.raising = false
	if s.lease != l {
		s.busy = false // released meanwhile: the slot was kept busy for this retune
	}
	switch {
	case err == nil:
		s.spec = spec
	case p.leases[l.id] == l:
		p.metrics.Error(metrics.RetuneFailed)
		undo()
	default:
		p.metrics.Error(metrics.RetuneFailed)
	}
	p.endIO()
	// Budget freed while this slot was being written passed over its
	// lease and the younger degraded ones (planRaises stops at a slot
	// being raised): hand it out now rather than at the next release.
	// After a failed write the next release tries again (not at once:
	// it would fail again).
	var raises []raise
	var cuts []cut
	if p.cutsOwed {
		// A wake came while this slot was being raised and could not cut
		// it: cut now, or the container stays over its budget until a
		// release.
		p.cutsOwed = false
		cuts = p.planCuts(nil)
	}
	if err == nil && len(cuts) == 0 {
		raises = p.planRaises()
	}
	p.broadcast()
	p.mu.Unlock()
	p.lower(cuts)
	return raises
}
