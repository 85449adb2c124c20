package client

// Miss and publish: a HOLD lease asked of the agent on the hold connection,
// room made in the table first, and the grant written into the table.

import (
	"context"
	"errors"
	"fmt"
	"sort"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// miss asks the agent for a HOLD lease of quotaMilli. stale: a reconnect
// happened while it was on its way.
func (lc *local) miss(quotaMilli uint32) (ok *slotv1.AcquireOK, stale bool, err error) {
	c := lc.c
	req := &slotv1.Acquire{QuotaMilli: quotaMilli, Flags: slotv1.AcquireHold, WaitUS: uint32(min(c.opts.Wait.Microseconds(), 1<<32-1))}
	// Idle held slots hold budget: give back what the new one would not
	// fit beside (the budget HELLO_OK announced), and if the agent still
	// refuses for budget, whatever is free.
	resp, fds, cn, err := lc.hold(req, false)
	if errors.Is(err, &slotv1.Error{Code: slotv1.CodeRejected}) || errors.Is(err, &slotv1.Error{Code: slotv1.CodeTimeout}) {
		if r, f, n, e := lc.hold(req, true); !errors.Is(e, errNoRoom) {
			resp, fds, cn, err = r, f, n, e
		}
	}
	if err != nil {
		return nil, false, err
	}
	// A grant (counted onWay) is published by the caller; anything else
	// was not counted.
	ok, err = c.grant(resp, fds, func(*slotv1.AcquireOK) { stale = cn != lc.conn() })
	return ok, stale, err
}

// publish writes a granted HOLD lease (asked for quotaMilli) into the
// table, claimed by holder (0: free). On a full table the lease goes back.
func (lc *local) publish(ok *slotv1.AcquireOK, quotaMilli, holder uint32) (slotv1.Claim, error) {
	var flags uint32
	if ok.Flags&slotv1.AcquiredDegraded != 0 {
		flags |= slotv1.EntryDegraded
	}
	lc.mu.Lock()
	lc.onWay -= uint64(ok.QuotaMilli) // in the table now, or given back
	if lc.closed {
		lc.mu.Unlock()
		lc.sendRelease(ok.Lease)
		return slotv1.Claim{}, ErrClosed
	}
	cl, err := lc.t.Publish(slotv1.Entry{Slot: ok.Slot, QuotaMilli: ok.QuotaMilli, PeriodUS: ok.PeriodUS, Flags: flags, Lease: ok.Lease, AskedMilli: quotaMilli},
		holder, monotonicNow())
	var scribbled uint64
	if err == nil {
		if old := lc.own[cl.Index]; old != nil && !old.gone {
			// Our entry was scribbled empty: its lease is still ours.
			scribbled = old.lease
		}
		lc.own[cl.Index] = &ownEntry{slot: ok.Slot, quota: ok.QuotaMilli, lease: ok.Lease}
	}
	lc.mu.Unlock()
	if scribbled != 0 {
		lc.sendRelease(scribbled)
	}
	if err != nil {
		// The table is full: give the lease back (the thread leases for
		// itself).
		lc.sendRelease(ok.Lease)
	}
	return cl, err
}

// makeRoom empties free held entries, least recently used first, and
// returns their leases to release: until the process's held quota plus
// quotaMilli fits the container's announced budget, or (force) until they
// add up to quotaMilli. The caller holds cmu: no grant is on its way but
// those onWay counts.
func (lc *local) makeRoom(quotaMilli uint32, force bool) []uint64 {
	lc.c.mu.Lock()
	budget := uint64(lc.c.hello.BudgetMilli)
	lc.c.mu.Unlock()
	if budget == 0 && !force {
		return nil
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	held := uint64(quotaMilli) + lc.onWay
	type cand struct {
		i    int
		idle uint64
	}
	var free []cand
	for i, o := range lc.own {
		if !o.gone {
			held += uint64(o.quota)
		}
		if e := lc.t.Entry(i); slotv1.Holder(e.State) == 0 {
			free = append(free, cand{i, e.IdleSince})
		}
	}
	sort.Slice(free, func(a, b int) bool { return free[a].idle < free[b].idle })
	var leases []uint64
	freed := uint64(0)
	for _, f := range free {
		if force && freed >= uint64(quotaMilli) || !force && held <= budget {
			break
		}
		cl, r := lc.t.Control(f.i)
		if r != slotv1.Claimed {
			continue
		}
		o := lc.own[f.i]
		lc.t.Clear(cl, f.idle)
		delete(lc.own, f.i)
		if !o.gone {
			leases = append(leases, o.lease)
			held -= uint64(o.quota)
			freed += uint64(o.quota)
		}
	}
	return leases
}

// errNoRoom: a forced hold found no free held entry to give back.
var errNoRoom = errors.New("no room to make")

// hold makes room for req (makeRoom) and sends the releases, then the HOLD
// request, on the hold connection, so that the agent frees the budget
// before it admits the new lease. Under cmu, so that what the process
// holds does not move under makeRoom: the HOLD requests before this one
// have been answered, and a grant among them is in the table or onWay.
func (lc *local) hold(req *slotv1.Acquire, force bool) (slotv1.Message, []int, *conn, error) {
	lc.cmu.Lock()
	defer lc.cmu.Unlock()
	releases := lc.makeRoom(req.QuotaMilli, force)
	if force && len(releases) == 0 {
		return nil, nil, nil, errNoRoom
	}
	for attempt := 0; ; attempt++ {
		cn, err := lc.holdConn()
		if err != nil {
			return nil, nil, nil, err
		}
		for _, id := range releases {
			if err = cn.sendBeside(&slotv1.Release{Lease: id, Outcome: slotv1.InvocationOK, Flags: slotv1.ReleaseNoReply}); err != nil {
				break
			}
		}
		if err == nil {
			var resp slotv1.Message
			var fds []int
			if resp, fds, err = cn.roundTrip(req); err == nil {
				if e, ok := resp.(*slotv1.Error); ok {
					closeFDs(fds)
					return nil, nil, cn, e
				}
				if ok, isOK := resp.(*slotv1.AcquireOK); isOK {
					lc.mu.Lock()
					lc.onWay += uint64(ok.QuotaMilli) // until publish
					lc.mu.Unlock()
				}
				return resp, fds, cn, nil
			}
		}
		// The connection broke, and its leases ended with it (the
		// releases too): the next one re-declares what the table holds.
		cn.close()
		if attempt > 0 {
			return nil, nil, nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
		}
		releases = nil
	}
}

// conn is the hold connection (nil: none yet).
func (lc *local) conn() *conn {
	lc.cnMu.Lock()
	defer lc.cnMu.Unlock()
	return lc.cn
}

// holdConn returns the hold connection; when there is none, or the one
// there was closed (and its leases with it), it dials one and re-declares
// the held entries on it. The caller holds cmu.
func (lc *local) holdConn() (*conn, error) {
	if cn := lc.conn(); cn != nil && !cn.gone() {
		return cn, nil
	}
	cn, err := lc.c.dial(context.Background())
	if err != nil {
		return nil, err
	}
	lc.mu.Lock()
	err = lc.reclaimAllOn(cn)
	closed := lc.closed
	lc.mu.Unlock()
	if err == nil && closed {
		err = ErrClosed
	}
	if err != nil {
		cn.close()
		return nil, err
	}
	lc.swapConn(cn)
	return cn, nil
}

// connGone reports whether the hold connection was closed.
func (lc *local) connGone() bool {
	cn := lc.conn()
	return cn != nil && cn.gone()
}

// closeConn closes the hold connection: the agent releases what it still
// holds.
func (lc *local) closeConn() { lc.swapConn(nil) }

// swapConn makes cn the hold connection and closes the one it replaces.
func (lc *local) swapConn(cn *conn) {
	lc.cnMu.Lock()
	old := lc.cn
	lc.cn = cn
	lc.cnMu.Unlock()
	if old != nil {
		old.close()
	}
}
