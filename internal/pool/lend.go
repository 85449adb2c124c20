package pool

import (
	"sort"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/metrics"
)

// Lending (docs/lending.md): the runtime, the trusted witness of when an
// invocation blocks, says a lease sleeps; admission then charges it only
// (1 - lendRatio) of its quota, and new leases are admitted into the rest.
// The sleeper's slot keeps its whole quota: a wake needs no cgroup write,
// so the awake lease never waits. On WAKE the pool charges it in full
// again and, when that puts the container over its budget, degrades the
// youngest awake leases (the likely borrowers) by the excess; released
// budget raises them back as for any degraded lease, but not while it
// sleeps: freed budget goes to awake leases, and a degraded waker is raised
// when it wakes.

// Lends reports whether the pool lends the quota of sleeping leases.
func (p *Pool) Lends() bool { return p.cfg.LendRatio > 0 }

// Sleep marks owner's lease id as sleeping and lends its lendable share.
// A lease already sleeping lends nothing more; with lending off it lends
// nothing at all.
func (p *Pool) Sleep(owner Owner, id uint64) error {
	p.mu.Lock()
	l, err := p.ownLease(owner, id)
	if err != nil || l.sleeping {
		p.mu.Unlock()
		return err
	}
	l.sleeping = true
	raises := p.lend(l)
	p.mu.Unlock()
	p.raise(raises)
	return nil
}

// lend lends sleeping lease l's share and plans the raises it allows. A
// lease lends at most once a CFS period: one that lent less than a period
// ago lends when the period is over, if it still sleeps then. Lending
// raises borrowers and the WAKE cuts them, cgroup writes, so a lease
// flapping SLEEP and WAKE costs at most one retune each way per period
// (the kernel accounts CPU per period anyway). The caller holds the lock.
func (p *Pool) lend(l *lease) []raise {
	now := time.Now()
	if wait := l.lentAt.Add(time.Duration(p.cfg.PeriodUS) * time.Microsecond).Sub(now); wait > 0 {
		if !l.lendArmed {
			l.lendArmed = true
			time.AfterFunc(wait, func() { p.lendLater(l) })
		}
		return nil
	}
	l.lent = lendable(l.granted, p.cfg.LendRatio)
	if l.lent == 0 {
		return nil
	}
	l.lentAt = now
	p.lent += l.lent
	p.lends++
	p.budget.Give(l.lent)
	p.broadcast() // waiting requests may fit the lent budget
	return p.planRaises()
}

// lendLater lends the share of lease l, which slept within a period of its
// last lend, if it still sleeps (it may have woken again, or ended).
func (p *Pool) lendLater(l *lease) {
	p.mu.Lock()
	l.lendArmed = false
	var raises []raise
	if !p.closed && p.leases[l.id] == l && l.sleeping && l.lent == 0 {
		raises = p.lend(l)
	}
	p.mu.Unlock()
	p.raise(raises)
}

// Wake ends owner's lease id's sleep: it is charged its whole quota at once
// and the pool cuts the youngest awake leases by what the container is now
// over its budget. Waking an awake lease does nothing.
func (p *Pool) Wake(owner Owner, id uint64) error {
	start := time.Now()
	p.mu.Lock()
	l, err := p.ownLease(owner, id)
	if err != nil || !l.sleeping {
		p.mu.Unlock()
		return err
	}
	p.wakes++
	cuts := p.unlend(l)
	var raises []raise
	if len(cuts) == 0 {
		// Budget left free while it slept (sleepers are not raised) goes
		// to the degraded leases, a degraded waker among them.
		raises = p.planRaises()
	}
	p.mu.Unlock()
	p.lower(cuts)
	p.raise(raises)
	// The waker's slot kept its quota: its quota is back once the
	// borrowers are cut to the budget.
	p.metrics.WakeToQuota(time.Since(start))
	return nil
}

// lendable is the share of a quota of granted a sleeping lease lends.
func lendable(granted uint32, ratio float64) uint32 {
	if ratio <= 0 {
		return 0
	}
	return uint32(min(float64(granted)*min(ratio, 1), float64(granted)))
}

// ownLease finds owner's lease id; the caller holds the lock.
func (p *Pool) ownLease(owner Owner, id uint64) (*lease, error) {
	l := p.leases[id]
	if l == nil || l.owner != owner {
		p.metrics.Error(metrics.UnknownLease)
		return nil, errorf(UnknownLease, "lease %d is not held by this connection (unknown or already released)", id)
	}
	return l, nil
}

// charged is what lease l counts in the budget now.
func (l *lease) charged() uint32 { return l.granted - l.lent }

// unlend charges sleeping lease l in full again and plans the cuts that
// bring the container back within its budget. The caller holds the lock.
func (p *Pool) unlend(l *lease) []cut {
	l.sleeping = false
	if l.lent == 0 {
		return nil
	}
	p.lent -= l.lent
	p.givebacks++
	p.budget.Take(l.lent)
	l.lent = 0
	if l.slot.lease != l {
		return nil // being released: its release gives it all back
	}
	return p.planCuts(l)
}

// cut is an awake lease's grant lowered to give a waking lease its quota
// back, whose slot is yet to be retuned.
type cut struct {
	l    *lease
	by   uint32
	spec cgroup.Spec
	// degraded: this cut put the lease on the degraded list (undone with it)
	degraded bool
}

// planCuts lowers the youngest awake leases other than waker, each down to
// the minimum degraded grant, until the budget holds what is granted (or no
// lease is left to cut: the excess then waits for releases, as after a
// limit shrink). A lease whose slot is busy with I/O is skipped. The
// caller holds the lock.
func (p *Pool) planCuts(waker *lease) []cut {
	limit := p.budget.Limit
	if limit == 0 || p.budget.Used() <= limit {
		return nil
	}
	floor := max(p.cfg.MinDegradedMilli, 1)
	var awake []*lease
	raising := false
	for _, l := range p.leases {
		if l != waker && !l.sleeping && l.granted > floor && l.slot.lease == l &&
			!l.slot.busy && l.slot.io != nil {
			if l.slot.raising {
				raising = true // cut once its raise is written (retune)
				continue
			}
			awake = append(awake, l)
		}
	}
	sort.Slice(awake, func(i, j int) bool { return awake[i].id > awake[j].id })
	var out []cut
	for _, l := range awake {
		excess := p.budget.Used() - limit
		if excess == 0 {
			break
		}
		by := min(l.granted-floor, excess)
		l.granted -= by
		p.budget.Give(by)
		newly := !l.degraded
		if newly {
			l.degraded = true
			p.degraded = append(p.degraded, l)
		}
		l.slot.raising = true
		p.beginIO()
		out = append(out, cut{l: l, by: by, spec: p.spec(l.granted), degraded: newly})
	}
	p.cuts += uint64(len(out))
	p.cutsOwed = raising && p.budget.Used() > limit
	return out
}

// lower retunes the cut leases' slots outside the lock. A retune that
// fails leaves the slot at its old quota, so the lease is charged it again.
func (p *Pool) lower(cuts []cut) {
	for _, c := range cuts {
		p.raise(p.retune(c.l, c.spec, func() {
			p.budget.Take(c.by)
			c.l.granted += c.by
			if c.degraded {
				c.l.degraded = false
				p.dropDegraded(c.l)
			}
		}))
	}
}

// clampLent keeps what sleeping lease l lends within its share of what it
// is granted, after its grant shrank (a raise that failed). The caller
// holds the lock.
func (p *Pool) clampLent(l *lease) {
	if keep := lendable(l.granted, p.cfg.LendRatio); l.lent > keep {
		p.lent -= l.lent - keep
		p.budget.Take(l.lent - keep)
		l.lent = keep
		if keep == 0 {
			p.givebacks++ // it lends nothing any more
		}
	}
}

// endSleep forgets the lent share of lease l, which ends: the budget gets
// back only what l was charged. The caller holds the lock.
func (p *Pool) endSleep(l *lease) {
	if l.lent > 0 {
		p.lent -= l.lent
		p.givebacks++
	}
}
