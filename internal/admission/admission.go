// Package admission decides whether an invocation's CPU quota fits a
// container's budget: the container's CPU limit (or a configured budget)
// times an overcommit factor. What happens to a request that does not fit is
// a policy: wait for budget (queue), run now with what is left and be raised
// later (degrade, the isolation paper's rebalancing), or fail (reject).
package admission

import (
	"fmt"
	"math"
	"slices"
)

// Policy is what to do with a request that does not fit; its value is the
// name a setting gives it.
type Policy string

const (
	Queue   Policy = "queue"
	Degrade Policy = "degrade"
	Reject  Policy = "reject"
)

// Policies are the policies, in the order the docs list them.
var Policies = []Policy{Queue, Degrade, Reject}

// ParsePolicy reads "queue", "degrade" or "reject".
func ParsePolicy(s string) (Policy, error) {
	if p := Policy(s); slices.Contains(Policies, p) {
		return p, nil
	}
	return "", fmt.Errorf("admission policy %q: want queue, degrade or reject", s)
}

// Budget tracks the quota granted against a limit. It is not safe for
// concurrent use: its owner (a pool) serialises calls.
type Budget struct {
	// Limit is the budget in millicores; 0 means unlimited.
	Limit  uint32
	Policy Policy
	// MinMilli is the smallest quota a degraded grant may get.
	MinMilli uint32
	used     uint32
}

// New makes a budget of base millicores (0 = unlimited) times overcommit.
func New(base uint32, overcommit float64, policy Policy, minMilli uint32) *Budget {
	if overcommit <= 0 {
		overcommit = 1
	}
	limit := uint32(0)
	if base > 0 {
		limit = uint32(math.Min(math.Round(float64(base)*overcommit), math.MaxUint32))
	}
	return &Budget{Limit: limit, Policy: policy, MinMilli: minMilli}
}

// Decision is the outcome of Admit.
type Decision int

const (
	Grant  Decision = iota // take Granted now
	Wait                   // wait for budget, then ask again
	Refuse                 // fail the request
)

// Admit decides on a request for want millicores. Granted is what may be
// taken now (less than want when degraded). Reason explains a Refuse.
func (b *Budget) Admit(want uint32) (d Decision, granted uint32, reason string) {
	if b.Fits(want) {
		return Grant, want, ""
	}
	free := b.Limit - min(b.used, b.Limit)
	switch b.Policy {
	case Degrade:
		if free >= b.MinMilli && free > 0 {
			return Grant, free, ""
		}
		return Wait, 0, ""
	case Reject:
		return Refuse, 0, fmt.Sprintf("quota %dm does not fit: %dm of %dm budget free", want, free, b.Limit)
	}
	if want > b.Limit {
		return Refuse, 0, fmt.Sprintf("quota %dm exceeds the whole budget of %dm", want, b.Limit)
	}
	return Wait, 0, ""
}

// Fits reports whether want millicores fit the budget now. The sum is
// taken in 64 bits: a quota near 2^32 must not wrap around to fit.
func (b *Budget) Fits(want uint32) bool {
	return b.Limit == 0 || uint64(b.used)+uint64(want) <= uint64(b.Limit)
}

// Take records a grant. The sum saturates: used never wraps to look small.
func (b *Budget) Take(m uint32) { b.used = uint32(min(uint64(b.used)+uint64(m), math.MaxUint32)) }

// Give returns a grant.
func (b *Budget) Give(m uint32) { b.used -= min(m, b.used) }

// Used is what is granted now.
func (b *Budget) Used() uint32 { return b.used }

// Free is what is left (MaxUint32 when unlimited).
func (b *Budget) Free() uint32 {
	if b.Limit == 0 {
		return math.MaxUint32
	}
	return b.Limit - min(b.used, b.Limit)
}
