package client

// Acquire and waiters: a thread claims a held slot of its quota (its own
// entry first, then any free one), waits in arrival order when none is
// free, and asks the agent for more while threads wait.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// waiter is a thread waiting for an entry of quota. Entries freed while
// threads wait go to them in arrival order before any thread claims one
// again, and so do HOLD leases the agent grants meanwhile: one queue for
// both, so that a thread holding an entry in a closed loop cannot keep it
// from a thread that waits.
type waiter struct {
	tid   int
	quota uint32
	got   chan served // buffered: whoever serves never blocks
	since time.Time   // when it queued
}

// served is what a waiter gets: an entry claimed for it (ok set when the
// agent granted it just now), or the agent's refusal of its own request.
type served struct {
	cl  slotv1.Claim
	ok  *slotv1.AcquireOK
	err error
}

// acquire places the calling thread in a held slot of quotaMilli: the entry
// it used last (no write when it still sits there), else any free entry
// (one write), else it waits in the local queue for an entry another
// thread releases or a new HOLD lease (a round trip). While threads wait,
// newcomers queue behind them.
func (lc *local) acquire(ctx context.Context, tid int, quotaMilli uint32, action string) (*Lease, error) {
	if err := slotv1.CheckString(action); err != nil {
		return nil, fmt.Errorf("cpuslot: action: %w", err)
	}
	c, t := lc.c, lc.t
	c.mu.Lock()
	cur := c.current[tid]
	last, hasLast := c.lastEntry[tid]
	c.mu.Unlock()
	if !hasLast {
		last = -1
	}
	if lc.waiting.Load() == 0 {
		now := monotonicNow()
		// (1) The thread's last entry.
		if hasLast && t.Match(last, quotaMilli) {
			if cl, r := t.Claim(last, uint32(tid), quotaMilli, now); r == slotv1.Claimed {
				if l, err := lc.use(tid, cl, cur, last, action, slotv1.OutcomeAffinityHit); err == nil {
					return l, nil
				}
			}
		}
		// (2) Any free entry of the quota.
		if cl, ok := lc.claimFree(tid, quotaMilli); ok {
			if l, err := lc.use(tid, cl, cur, last, action, slotv1.OutcomeCacheHit); err == nil {
				return l, nil
			}
		}
	}
	// (3) Wait in turn.
	if !c.localOn.Load() {
		return nil, errNoLocal
	}
	deadline := time.Now().Add(c.opts.Wait) // kept when an entry served was not usable
	for {
		s := lc.wait(ctx, tid, quotaMilli, deadline)
		if s.err != nil {
			return nil, s.err
		}
		if s.ok == nil {
			l, err := lc.use(tid, s.cl, cur, last, action, slotv1.OutcomeCacheHit)
			if err == nil {
				return l, nil
			}
			continue // given back as not usable: wait again
		}
		l, err := lc.use(tid, s.cl, 0, -1, action, s.ok.Outcome)
		if err != nil {
			return nil, fmt.Errorf("cpuslot: placing thread in slot %d: %w", s.ok.Slot, err)
		}
		l.Queued = s.ok.Flags&slotv1.AcquiredQueued != 0
		if s.ok.Place == slotv1.PlaceNone {
			l.Outcome = s.ok.Outcome
		}
		return l, nil
	}
}

// claimFree claims any free entry of quotaMilli for thread tid, starting at
// a place of the thread's own so that threads do not all race for the
// first one.
func (lc *local) claimFree(tid int, quotaMilli uint32) (slotv1.Claim, bool) {
	t := lc.t
	n := t.Cap()
	from := tid % n
	now := monotonicNow()
	for k := 0; k < n; k++ {
		i := from + k
		if i >= n {
			i -= n
		}
		if !t.Match(i, quotaMilli) {
			continue
		}
		if cl, r := t.Claim(i, uint32(tid), quotaMilli, now); r == slotv1.Claimed {
			return cl, true
		}
	}
	return slotv1.Claim{}, false
}

// claimOwn claims a free entry of quotaMilli this process published for
// thread tid.
func (lc *local) claimOwn(tid int, quotaMilli uint32) (slotv1.Claim, bool) {
	now := monotonicNow()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for i, o := range lc.own {
		if o.gone || !lc.t.Match(i, quotaMilli) {
			continue
		}
		if cl, r := lc.t.Claim(i, uint32(tid), quotaMilli, now); r == slotv1.Claimed {
			return cl, true
		}
	}
	return slotv1.Claim{}, false
}

// wait queues the calling thread for an entry of quotaMilli and blocks
// until it is served. Unless a HOLD request for the quota is on its way
// already, it sends one, whose grant goes to the first thread waiting for
// the quota and whose refusal to this thread. When ctx ends first the
// thread leaves the queue, or gives back the entry it was served meanwhile;
// when its wait ends first (waitLeftLocked) it leaves with TIMEOUT.
func (lc *local) wait(ctx context.Context, tid int, quotaMilli uint32, deadline time.Time) served {
	w := &waiter{tid: tid, quota: quotaMilli, got: make(chan served, 1), since: time.Now()}
	lc.qmu.Lock()
	lc.queue = append(lc.queue, w)
	lc.waiting.Add(1)
	lc.serveLocked()
	ask := lc.queuedLocked(w) && !lc.asking[quotaMilli]
	if ask {
		lc.asking[quotaMilli] = true
		lc.asks.Add(1)
	}
	lc.qmu.Unlock()
	if ask {
		go func() {
			defer lc.asks.Done()
			lc.ask(w)
		}()
	}
	for ended := false; !ended; {
		var expired <-chan time.Time // nil: no budget of the client's own
		if lc.c.opts.Wait > 0 {
			lc.qmu.Lock()
			left := lc.waitLeftLocked(w, deadline)
			if k := slices.Index(lc.queue, w); left <= 0 && k >= 0 {
				lc.dequeueLocked(k)
				lc.qmu.Unlock()
				return served{err: slotv1.Errorf(slotv1.CodeTimeout, "waited in turn for a held slot past the acquire budget")}
			}
			lc.qmu.Unlock()
			if left > 0 { // else it was served: the entry is on its way
				expired = time.After(left)
			}
		}
		select {
		case s := <-w.got:
			return s
		case <-expired: // look again: a grant meanwhile extends the wait
		case <-ctx.Done():
			ended = true
		}
	}
	lc.qmu.Lock()
	if k := slices.Index(lc.queue, w); k >= 0 {
		lc.dequeueLocked(k)
		lc.qmu.Unlock()
		return served{err: ctx.Err()}
	}
	lc.qmu.Unlock()
	if s := <-w.got; s.err == nil { // served as ctx ended: sent at once
		lc.t.Release(s.cl, monotonicNow())
		lc.serveWaiters()
	}
	return served{err: ctx.Err()}
}

// waitLeftLocked is how much longer w may wait: until deadline, the end of
// its acquire budget (Options.Wait), or one budget after the agent's last
// grant of its quota since w queued, whichever is later. HOLD requests of a
// quota go one at a time, so the n-th of n threads that miss together is
// served by the n-th answer: while the agent grants each within the budget
// they all wait their turn; once it grants nothing within it, they go on
// without a slot. The caller holds qmu.
func (lc *local) waitLeftLocked(w *waiter, deadline time.Time) time.Duration {
	end := deadline
	if g, ok := lc.grantedAt[w.quota]; ok && !g.Before(w.since) {
		end = maxTime(end, g.Add(lc.c.opts.Wait))
	}
	return time.Until(end)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// serveWaiters hands free entries to waiting threads; one atomic load when
// none waits (the release path).
func (lc *local) serveWaiters() {
	if lc.waiting.Load() == 0 {
		return
	}
	lc.qmu.Lock()
	lc.serveLocked()
	lc.qmu.Unlock()
}

// serveLocked claims free entries of the process's own for waiting
// threads, first come first served (an entry of another process sharing
// the table has no fds here). The caller holds qmu.
func (lc *local) serveLocked() {
	for k := 0; k < len(lc.queue); {
		w := lc.queue[k]
		if cl, ok := lc.claimOwn(w.tid, w.quota); ok {
			lc.dequeueLocked(k)
			w.got <- served{cl: cl}
			continue
		}
		k++
	}
}

func (lc *local) dequeueLocked(k int) {
	lc.queue = append(lc.queue[:k], lc.queue[k+1:]...)
	lc.waiting.Add(-1)
}

func (lc *local) queuedLocked(w *waiter) bool {
	for _, q := range lc.queue {
		if q == w {
			return true
		}
	}
	return false
}

// firstLocked removes and returns the first thread waiting for quota (nil:
// none). The caller holds qmu.
func (lc *local) firstLocked(quota uint32) *waiter {
	for k, w := range lc.queue {
		if w.quota == quota {
			lc.dequeueLocked(k)
			return w
		}
	}
	return nil
}

// ask sends HOLD requests for asker's quota until no thread waits for it:
// a grant is published, claimed for the first thread waiting for the quota
// (free if none waits any more); a refusal goes to the thread the request
// was sent for, if it still waits (the others wait on, for entries and the
// next request).
func (lc *local) ask(asker *waiter) {
	quota := asker.quota
	for {
		ok, stale, err := lc.miss(quota)
		if err == nil && lc.afterGrant != nil {
			lc.afterGrant(quota)
		}
		lc.qmu.Lock()
		if err == nil {
			lc.grantedAt[quota] = time.Now() // the waiters of the quota wait on
		}
		var w *waiter
		var cl slotv1.Claim
		if err == nil {
			var holder uint32
			if w = lc.firstLocked(quota); w != nil {
				holder = uint32(w.tid)
			}
			if cl, err = lc.publish(ok, quota, holder); err != nil && w == nil && lc.queuedLocked(asker) {
				// Nobody to give the error to but the asker.
				w = asker
				lc.dequeueLocked(slices.Index(lc.queue, asker))
			}
		} else if lc.queuedLocked(asker) {
			w = asker
			lc.dequeueLocked(slices.Index(lc.queue, asker))
		}
		lc.qmu.Unlock()
		if err == nil && stale {
			// A reconnect re-declared held entries while this grant was on
			// its way: declare it too (it is the old agent's lease).
			lc.reclaim(cl.Index)
		}
		if w != nil {
			if err != nil {
				w.got <- served{err: err}
			} else {
				w.got <- served{cl: cl, ok: ok}
			}
		}
		lc.qmu.Lock()
		lc.serveLocked()
		next := -1
		for k, q := range lc.queue {
			if q.quota == quota {
				next = k
				break
			}
		}
		if next < 0 {
			delete(lc.asking, quota)
			lc.qmu.Unlock()
			return
		}
		asker = lc.queue[next]
		lc.qmu.Unlock()
	}
}

// errNotUsable means a claimed entry could not be used (its slot has no fds
// here, or placement failed); the entry was given back.
var errNotUsable = errors.New("entry not usable")

// use places the thread in claimed entry cl's slot unless it sits there,
// and starts the invocation's usage.
// last is the entry the thread used last (-1: none).
func (lc *local) use(tid int, cl slotv1.Claim, cur uint32, last int, action string, outcome slotv1.Outcome) (*Lease, error) {
	c, t := lc.c, lc.t
	e := t.Entry(cl.Index)
	c.mu.Lock()
	place, stat := c.splitLocked(c.fds[e.Slot])
	c.mu.Unlock()
	if len(place) == 0 {
		// A slot this process holds no fds for (another process's entry,
		// or a scribbled slot id): GONE for this process.
		t.Release(cl, e.IdleSince)
		return nil, errNotUsable
	}
	l := &Lease{c: c, Local: true, claim: cl, Slot: e.Slot, QuotaMilli: e.QuotaMilli, Outcome: outcome, Place: slotv1.PlaceNone,
		Degraded: e.Flags&slotv1.EntryDegraded != 0, tid: tid, action: action, stat: stat}
	if cur != e.Slot {
		if err := placeSelf(place); err != nil {
			// The slot is gone (or the entry lies): never claim it again.
			t.MarkGone(cl.Index)
			t.Release(cl, e.IdleSince)
			c.setCurrent(tid, 0)
			return nil, errNotUsable
		}
		l.Place = slotv1.PlaceSelf
		if outcome == slotv1.OutcomeAffinityHit {
			l.Outcome = slotv1.OutcomeCacheHit
		}
	}
	if cur != e.Slot || last != cl.Index {
		c.mu.Lock()
		c.current[tid] = e.Slot
		c.lastEntry[tid] = cl.Index
		c.mu.Unlock()
	}
	l.start, l.hasStart = readCounters(stat)
	return l, nil
}
