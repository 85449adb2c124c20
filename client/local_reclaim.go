package client

// Reclaim after a reconnect: every held entry re-declared (RECLAIM) on the
// new hold connection; a refused one is marked GONE.

import (
	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// recovered re-declares the held entries after a reconnect if the hold
// connection is gone (the agent restarted, or closed it).
func (lc *local) recovered() error {
	if cn := lc.conn(); cn == nil || !cn.gone() {
		return nil
	}
	lc.cmu.Lock()
	defer lc.cmu.Unlock()
	_, err := lc.holdConn()
	return err
}

// reclaimAllOn re-declares every held entry on cn, the new hold
// connection. The caller holds lc.mu.
func (lc *local) reclaimAllOn(cn *conn) error {
	for i := range lc.own {
		if err := lc.reclaimOn(cn, i); err != nil {
			return err
		}
	}
	// Refused entries no invocation holds go now; the others once free.
	for i, o := range lc.own {
		if o.gone && slotv1.Holder(lc.t.State(i)) == 0 {
			lc.dropLocked(i, o)
		}
	}
	return nil
}

func (lc *local) reclaim(i int) {
	lc.cmu.Lock()
	defer lc.cmu.Unlock()
	cn, err := lc.holdConn()
	if err != nil {
		return
	}
	lc.mu.Lock()
	err = lc.reclaimOn(cn, i)
	lc.mu.Unlock()
	if err != nil {
		cn.close()
	}
}

// reclaimOn sends RECLAIM (tid 0) for own entry i: the new lease id goes
// into the entry; a refusal marks it GONE. The caller holds lc.mu.
func (lc *local) reclaimOn(cn *conn, i int) error {
	o, ok := lc.own[i]
	if !ok {
		return nil
	}
	if o.gone {
		return nil
	}
	resp, fds, err := cn.roundTrip(&slotv1.Reclaim{Slot: o.slot, QuotaMilli: o.quota})
	if err != nil {
		return err
	}
	if ok, isOK := resp.(*slotv1.AcquireOK); isOK && ok.Slot == o.slot {
		o.lease = ok.Lease
		lc.t.SetLease(i, ok.Lease)
		lc.c.mu.Lock()
		lc.c.cacheFDs(ok.Slot, fds)
		lc.c.mu.Unlock()
		return nil
	}
	closeFDs(fds)
	o.gone = true
	lc.t.MarkGone(i)
	return nil
}
