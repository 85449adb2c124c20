package pool

import (
	"github.com/cpuslot/cpuslot/internal/outcome"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// CacheLazy: per-quota cache of pre-made slots, placement by numeric TID;
// a thread stays in its slot after release until another thread needs the
// slot ("CGroup Caching @ Graalvisor", lazy reclamation).
var CacheLazy = registerMode(settings.ModeCacheLazy, cacheLazy{})

// cacheLazy is a research baseline ("CGroup Caching @ Graalvisor", lazy):
// a cache of slots per quota; the agent moves the previous occupant out and
// writes the thread's TID, unless the thread is already there; release
// does nothing.
type cacheLazy struct{}

func (cacheLazy) pick(p *Pool, req Request, q uint32) (plan, bool) {
	if s := p.pickFree(q, false); s != nil {
		pl := plan{s: s, outcome: outcome.CacheHit, place: PlaceDone}
		if s.occupant == req.Thread {
			pl.place = PlaceNone
		} else {
			evict(&pl)
		}
		return pl, true
	}
	pl, ok := p.growOrRetune(q, PlaceDone)
	if ok && pl.retune && pl.s.occupant != req.Thread {
		evict(&pl)
	}
	return pl, ok
}

// evict has the plan move the slot's lazy occupant out first, if the agent
// placed it.
func evict(pl *plan) {
	if pl.s.occupantHost != 0 {
		pl.evict, pl.evictStart = pl.s.occupantHost, pl.s.occupantStart
	}
}

func (cacheLazy) needsHostTID(bool) bool { return true }

// release leaves the thread where it is.
func (cacheLazy) release(*Pool, *lease) released { return released{} }

func (cacheLazy) movesOnRelease() bool { return false }
func (cacheLazy) keepsSlots() bool     { return true }
