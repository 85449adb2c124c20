package pool

import (
	"github.com/cpuslot/cpuslot/internal/outcome"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// CacheEager: as CacheLazy, but the thread is moved out on release (the
// same thesis, non-lazy reclamation).
var CacheEager = registerMode(settings.ModeCacheEager, cacheEager{})

// cacheEager is a research baseline ("CGroup Caching @ Graalvisor",
// non-lazy): a cache of slots per quota; the agent writes the thread's TID
// on acquisition and moves the thread out on release.
type cacheEager struct{}

func (cacheEager) pick(p *Pool, req Request, q uint32) (plan, bool) {
	if s := p.pickFree(q, false); s != nil {
		return plan{s: s, outcome: outcome.CacheHit, place: PlaceDone}, true
	}
	return p.growOrRetune(q, PlaceDone)
}

func (cacheEager) needsHostTID(bool) bool { return true }

// release moves the thread back to the container.
func (cacheEager) release(p *Pool, l *lease) released {
	if l.hostTID != 0 {
		p.moveOut(l.hostTID, l.hostStart)
	}
	return released{vacated: true}
}

func (cacheEager) movesOnRelease() bool { return true }
func (cacheEager) keepsSlots() bool     { return true }
