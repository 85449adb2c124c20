package pool

import (
	"github.com/cpuslot/cpuslot/internal/outcome"
)

// mode is how a pool finds and places slots: the product (affinity) and
// the research baselines it is measured against each implement it in a
// file of their own.
type mode interface {
	// pick chooses a slot of quota q for req. It runs under the pool's
	// lock and only decides; the pool does the plan's I/O after. false:
	// nothing is free now and no slot may be made.
	pick(p *Pool, req Request, q uint32) (plan, bool)
	// needsHostTID reports whether an acquisition has the agent write the
	// thread's TID (so it needs the thread's id in the agent's namespace).
	needsHostTID(agentPlaces bool) bool
	// release does what ending a lease does to its slot; it runs outside
	// the lock, with the slot busy.
	release(p *Pool, l *lease) released
	// movesOnRelease reports whether release moves threads.
	movesOnRelease() bool
	// keepsSlots reports whether the mode keeps slots between leases:
	// adopts the slots an earlier agent left and pre-warms.
	keepsSlots() bool
}

// released is what a mode's release did to the slot.
type released struct {
	// vacated: the thread is no longer in the slot.
	vacated bool
	// removed: the slot is gone.
	removed bool
}

// modes are the modes' implementations, each registered by its own file.
var modes = map[Mode]mode{}

// registerMode records the implementation of mode m and returns m.
func registerMode(m Mode, impl mode) Mode {
	modes[m] = impl
	return m
}

// Place tells the client what to do after a grant.
type Place uint8

const (
	PlaceNone Place = iota // the thread already sits in the slot
	PlaceSelf              // the thread writes "0" to each of the slot's fds
	PlaceDone              // the agent placed the thread
)

// plan is what an acquisition will do once the lock is released.
type plan struct {
	s       *slot
	outcome outcome.Acquisition
	create  bool
	retune  bool
	place   Place
	// evict is the host TID of a lazy occupant to move out first
	// (cache-lazy), evictStart its start time.
	evict      int
	evictStart uint64
}

// io reports whether the plan writes to the slot's cgroup.
func (pl plan) io() bool { return pl.create || pl.retune || pl.place == PlaceDone }

// free reports whether a slot may be picked.
func (s *slot) free() bool { return s.lease == nil && !s.busy }

// sitting returns the slot req's thread says it sits in, if it is free
// and the thread is its occupant.
func (p *Pool) sitting(req Request) *slot {
	if cur := p.slots[req.CurrentSlot]; cur != nil && cur.free() && cur.occupant == req.Thread {
		return cur
	}
	return nil
}

// growOrRetune makes a new slot of quota q, or at the bound retunes a free
// slot of another quota, preferring one nobody sits in.
func (p *Pool) growOrRetune(q uint32, place Place) (plan, bool) {
	if pl, ok := p.planCreate(q, place); ok {
		return pl, true
	}
	if s := p.pickAnyFree(); s != nil {
		return plan{s: s, outcome: outcome.Retuned, retune: true, place: place}, true
	}
	return plan{}, false
}

func (p *Pool) planCreate(q uint32, place Place) (plan, bool) {
	if len(p.slots) >= p.cfg.MaxSlots {
		return plan{}, false
	}
	s := &slot{id: p.allocID(), spec: p.spec(q), busy: true}
	p.slots[s.id] = s
	return plan{s: s, outcome: outcome.Created, create: true, place: place}, true
}

// pickFree returns a free slot of quota q. With preferEmpty (affinity) a
// slot no thread sits in comes first, then the one freed longest ago, so
// that threads keep their own slots; without (the cache baselines) the
// most recently freed (a LIFO cache).
func (p *Pool) pickFree(q uint32, preferEmpty bool) *slot {
	var best *slot
	for _, s := range p.slots {
		if !s.free() || s.spec.QuotaMilli != q {
			continue
		}
		if best == nil {
			best = s
			continue
		}
		if preferEmpty {
			be, se := best.occupant == Thread{}, s.occupant == Thread{}
			if se && !be || se == be && s.freeSince.Before(best.freeSince) {
				best = s
			}
		} else if s.freeSince.After(best.freeSince) {
			best = s
		}
	}
	return best
}

func (p *Pool) pickAnyFree() *slot {
	var best *slot
	for _, s := range p.slots {
		if !s.free() {
			continue
		}
		if best == nil || (s.occupant == Thread{}) && (best.occupant != Thread{}) || s.freeSince.Before(best.freeSince) {
			best = s
		}
	}
	return best
}
