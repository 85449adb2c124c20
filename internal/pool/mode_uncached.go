package pool

import (
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// Uncached: create a cgroup per invocation, set its quota, place, and
// remove it on release ("Performance Isolation in GraalVM Native Image
// Isolates").
var Uncached = registerMode(settings.ModeUncached, uncached{})

// uncached is a research baseline ("Performance Isolation in GraalVM Native
// Image Isolates"): every acquisition creates a cgroup, sets its quota and
// writes the thread's TID; release removes it. No slot outlives its lease.
type uncached struct{}

func (uncached) pick(p *Pool, _ Request, q uint32) (plan, bool) {
	return p.planCreate(q, PlaceDone)
}

func (uncached) needsHostTID(bool) bool { return true }

// release removes the slot (moving the thread out); a slot that cannot be
// removed stays as a free slot for the reaper to retry.
func (uncached) release(p *Pool, l *lease) released {
	if err := l.slot.io.Remove(); err != nil {
		p.metrics.Error(metrics.RemoveFailed)
		return released{}
	}
	return released{vacated: true, removed: true}
}

func (uncached) movesOnRelease() bool { return false }
func (uncached) keepsSlots() bool     { return false }
