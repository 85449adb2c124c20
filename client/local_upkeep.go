package client

// Upkeep, off the invocation path (run): usage sent in USAGE messages, the
// grants of HOLD leases asked (HOLD_LIST) and given back, and entries of dead
// threads freed and idle or unbacked ones dropped.

import (
	"context"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// run sends USAGE (every second, or early with 8 keys pending) and drops
// idle and GONE entries, off the invocation path.
func (lc *local) run() {
	defer close(lc.ran)
	// Close ends a reconnect under way here (it waits for run).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-lc.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(usageEvery)
	defer tick.Stop()
	sweep := time.NewTicker(max(lc.idle/4, 10*time.Millisecond))
	defer sweep.Stop()
	for {
		select {
		case <-lc.c.stop:
			return
		case <-lc.quit:
			return
		case <-lc.kick:
			lc.flush()
		case <-tick.C:
			lc.flush()
			lc.c.checkAgent(ctx)
			lc.freeDead(monotonicNow())
			lc.serveWaiters()
			lc.checkHolds()
		case <-sweep.C:
			lc.dropIdle(monotonicNow())
		}
	}
}

// flush sends pending usage; what cannot be sent stays pending.
func (lc *local) flush() {
	lc.flushMu.Lock()
	defer lc.flushMu.Unlock()
	lc.usageMu.Lock()
	pending := lc.usage
	lc.usage = map[usageKey]*slotv1.UsageRecord{}
	lc.usageMu.Unlock()
	var recs []slotv1.UsageRecord
	for _, r := range pending {
		recs = append(recs, *r)
	}
	for len(recs) > 0 {
		n := min(len(recs), slotv1.MaxUsageRecords)
		if cn := lc.conn(); cn == nil || cn.sendBeside(&slotv1.Usage{Records: recs[:n]}) != nil {
			break
		}
		recs = recs[n:]
	}
	if len(recs) == 0 {
		return
	}
	lc.usageMu.Lock()
	for _, r := range recs {
		k := usageKey{r.Action, r.Outcome}
		if p := lc.usage[k]; p != nil {
			p.Invocations = uint32(min(uint64(p.Invocations)+uint64(r.Invocations), 1<<32-1))
			p.CPUNanos += r.CPUNanos
			p.ThrottledNanos += r.ThrottledNanos
		} else {
			r := r
			lc.usage[k] = &r
		}
	}
	lc.usageMu.Unlock()
}

// checkHolds asks the agent (HOLD_LIST) what the process's HOLD leases are granted now
// and how much of them to give back, once a round of run while it holds
// slots: a CPU limit shrink can leave the container's leases above its new
// budget, and a busy held slot never idles long enough to be dropped. An
// agent that did not announce HOLD_LIST is never asked.
func (lc *local) checkHolds() {
	c := lc.c
	if !c.holdListOn.Load() {
		return
	}
	lc.mu.Lock()
	n := len(lc.own)
	lc.mu.Unlock()
	if n == 0 {
		return
	}
	cn := lc.conn()
	if cn == nil || !lc.cmu.TryLock() {
		return // a HOLD is on its way there: next round
	}
	resp, err := c.exclusive(cn, &slotv1.HoldListRequest{}, func(*conn) {})
	lc.cmu.Unlock()
	if err != nil {
		return // refused for its rate, or the agent is away: next round
	}
	ok, isOK := resp.(*slotv1.HoldListOK)
	if !isOK {
		return
	}
	c.mu.Lock()
	c.hello.BudgetMilli = ok.BudgetMilli // makeRoom fits misses within it
	c.mu.Unlock()
	if cn != lc.conn() {
		return // lease ids of a connection replaced meanwhile
	}
	lc.giveBack(ok)
	lc.dropIdle(monotonicNow())
}

// giveBack applies a HOLD_LIST_OK: each own entry takes its lease's current
// grant, and entries adding up to give_back_m are given back, free ones
// at once (least recently used first), busy ones marked GONE so that no
// new claim takes them and dropped once their invocation released them.
func (lc *local) giveBack(ok *slotv1.HoldListOK) {
	byLease := make(map[uint64]slotv1.HoldLease, len(ok.Leases))
	for _, l := range ok.Leases {
		byLease[l.Lease] = l
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	want := uint64(ok.GiveBackMilli)
	type cand struct {
		i    int
		busy bool
		idle uint64
	}
	var cands []cand
	for i, o := range lc.own {
		if o.gone {
			continue
		}
		e := lc.t.Entry(i)
		if l, found := byLease[o.lease]; found && l.Slot == o.slot && e.Slot == o.slot {
			o.quota = l.QuotaMilli
			lc.t.SetGranted(i, l.QuotaMilli, l.Flags&slotv1.HoldDegraded != 0)
		}
		if e.Flags&slotv1.EntryGone != 0 || e.Slot != o.slot {
			// Given back already, its invocation still running: counted.
			want -= min(want, uint64(o.quota))
			continue
		}
		cands = append(cands, cand{i, slotv1.Holder(e.State) != 0, e.IdleSince})
	}
	sort.Slice(cands, func(a, b int) bool {
		if cands[a].busy != cands[b].busy {
			return !cands[a].busy
		}
		return cands[a].idle < cands[b].idle
	})
	for _, cd := range cands {
		if want == 0 {
			return
		}
		o := lc.own[cd.i]
		if !cd.busy {
			dropped, claimed := lc.dropLocked(cd.i, o)
			if dropped {
				want -= min(want, uint64(o.quota))
				continue
			}
			if claimed {
				return // agent away: next round
			}
		}
		// In use (or claimed since): no new claim takes it; dropIdle gives
		// it back once its invocation released it.
		lc.t.MarkGone(cd.i)
		want -= min(want, uint64(o.quota))
	}
}

// freeDead frees the process's own entries claimed by a thread that no
// longer exists: a thread of a process sharing the table (SPEC.md: "A
// process's children may share it") or of this one that died in an
// invocation would otherwise hold the entry, and the held slot with it, for
// ever. A holder counts as dead only when the kernel says no thread has its
// TID (kill(tid, 0): ESRCH); a TID reused since by a live thread keeps the
// entry claimed (the safe side), and the compare-and-swap on the state
// word read before the check leaves alone an entry claimed anew meanwhile.
func (lc *local) freeDead(now uint64) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for i := range lc.own {
		s := lc.t.State(i)
		h := slotv1.Holder(s)
		if h == 0 || h == slotv1.HolderControl || h > 1<<22 {
			continue // free, ours to control, or no TID the kernel hands out (a scribble)
		}
		if unix.Kill(int(h), 0) == unix.ESRCH {
			lc.t.FreeDead(i, s, now)
		}
	}
}

// dropIdle gives back held slots no invocation used for the idle time, and
// entries the agent no longer backs.
func (lc *local) dropIdle(now uint64) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for i, o := range lc.own {
		e := lc.t.Entry(i)
		if slotv1.Holder(e.State) != 0 {
			continue
		}
		if o.gone || e.Slot != o.slot || e.Flags&slotv1.EntryGone != 0 || now-e.IdleSince >= uint64(lc.idle) {
			lc.dropLocked(i, o)
		}
	}
}

// dropLocked releases own entry i's lease (unless the agent refused it)
// and empties the entry, if it is free. claimed says whether it was free;
// dropped whether it is gone (not when the agent was away: try again
// later). The caller holds lc.mu.
func (lc *local) dropLocked(i int, o *ownEntry) (dropped, claimed bool) {
	cl, r := lc.t.Control(i)
	if r != slotv1.Claimed {
		return false, false
	}
	idle := lc.t.Entry(i).IdleSince
	if !o.gone && !lc.sendRelease(o.lease) {
		lc.t.Release(cl, idle) // agent away: try again later
		return false, true
	}
	lc.t.Clear(cl, idle)
	delete(lc.own, i)
	return true, true
}

func (lc *local) sendRelease(lease uint64) bool {
	cn := lc.conn()
	return cn != nil && cn.sendBeside(&slotv1.Release{Lease: lease, Outcome: slotv1.InvocationOK, Flags: slotv1.ReleaseNoReply}) == nil
}
