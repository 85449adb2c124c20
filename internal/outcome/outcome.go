// Package outcome holds the pool's words for how a lease went: how an
// acquisition found its slot, how a lease ended, and the action a HOLD lease
// is counted under. The pool speaks them, metrics labels its series with
// them and the server maps them to the wire's (wire.go); it imports
// nothing, and sits beside metrics rather than under the pool, which
// imports metrics.
package outcome

// Acquisition is how a granted acquisition found its slot
// (cpuslot_acquisitions_total{outcome}).
type Acquisition string

const (
	AffinityHit Acquisition = "affinity_hit" // the thread sits in a free slot of the quota: no cgroup write
	CacheHit    Acquisition = "cache_hit"    // a free slot of the quota
	Retuned     Acquisition = "retuned"      // a free slot of another quota, retuned
	Created     Acquisition = "created"      // a new slot
	Reclaimed   Acquisition = "reclaimed"    // a lease re-declared after a reconnect
)

// Acquisitions lists every Acquisition.
var Acquisitions = []Acquisition{AffinityHit, CacheHit, Retuned, Created, Reclaimed}

// Ending is how a lease ended (cpuslot_lease_releases_total{outcome}).
type Ending string

const (
	EndOK              Ending = "ok"               // the invocation succeeded
	EndFailed          Ending = "failed"           // the invocation failed
	EndTimeout         Ending = "timeout"          // the invocation timed out
	EndPlacementFailed Ending = "placement_failed" // the client could not place its thread
	EndUnknown         Ending = "unknown"          // the client reported an outcome this agent does not know
	Abandoned          Ending = "abandoned"        // the client process went away holding the lease
	Superseded         Ending = "superseded"       // the thread asked for another slot while holding this one
)

// Endings lists every Ending.
var Endings = []Ending{EndOK, EndFailed, EndTimeout, EndPlacementFailed, EndUnknown, Abandoned, Superseded}

// HoldAction is the action label of HOLD leases (local leasing): a release
// counts the whole hold, measured by the agent; what each action used comes
// from the client's USAGE reports, under the action's own label.
const HoldAction = "_hold"
