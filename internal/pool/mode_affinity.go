package pool

import (
	"github.com/cpuslot/cpuslot/internal/outcome"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// Affinity (the default): prefer the free slot of the quota the thread
// already sits in (no cgroup write); else a free slot of the quota, the
// thread placing itself by writing "0" to the slot's fd; else retune a free
// slot the thread sits in; else create.
var Affinity = registerMode(settings.ModeAffinity, affinity{})

// affinity is the product: a thread keeps the slot it sits in, places
// itself through the slot's fds when it must move, and stays in its slot
// after release (lazy), so that its next invocation at the same quota
// costs no cgroup write at all.
type affinity struct{}

// pick takes, in order: the free slot of the quota the thread already sits
// in (no write); a free slot of the quota (the thread writes "0" to its
// fd); the free slot the thread sits in, retuned; a new slot; any free
// slot, retuned.
func (affinity) pick(p *Pool, req Request, q uint32) (plan, bool) {
	place := PlaceSelf
	if req.AgentPlaces {
		place = PlaceDone // a client without fds
	}
	cur := p.sitting(req)
	if cur != nil && cur.spec.QuotaMilli == q {
		return plan{s: cur, outcome: outcome.AffinityHit, place: PlaceNone}, true
	}
	if s := p.pickFree(q, true); s != nil {
		return plan{s: s, outcome: outcome.CacheHit, place: place}, true
	}
	if cur != nil {
		return plan{s: cur, outcome: outcome.Retuned, retune: true, place: PlaceNone}, true
	}
	return p.growOrRetune(q, place)
}

func (affinity) needsHostTID(agentPlaces bool) bool { return agentPlaces }

// release leaves the thread where it is.
func (affinity) release(*Pool, *lease) released { return released{} }

func (affinity) movesOnRelease() bool { return false }
func (affinity) keepsSlots() bool     { return true }
