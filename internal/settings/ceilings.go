package settings

import (
	"fmt"
	"slices"
)

// Ceilings are the operator's bounds on what a pod's annotations may set:
// where tenants write pod annotations (a Knative Service's template), an
// annotation must not raise the limits the operator relies on. A value
// above its ceiling is clamped to it (Clamp). A zero field is no ceiling,
// but for BudgetMilli.
type Ceilings struct {
	// MaxSlots bounds pool.maxSlots.
	MaxSlots int
	// PrewarmSlots bounds the slots pool.prewarm keeps ready, all quotas
	// together.
	PrewarmSlots int
	// Overcommit bounds admission.overcommit.
	Overcommit float64
	// LendRatio bounds admission.lendRatio.
	LendRatio float64
	// BudgetMilli bounds admission.budget; 0: the container's CPU limit
	// (none when it has none).
	BudgetMilli uint32
}

// DefaultCeilings are safe for tenants who write their own annotations:
// twice the default slots, 32 pre-warmed, overcommit 2, half a sleeping
// lease lent, and no budget above the container's CPU limit.
func DefaultCeilings() Ceilings {
	return Ceilings{MaxSlots: 128, PrewarmSlots: 32, Overcommit: 2, LendRatio: 0.5}
}

// Clamped says an annotation's value was above the operator's ceiling and
// what it was lowered to.
type Clamped struct {
	// Source is the annotation; Value what it asked, Ceiling what is used.
	Source, Value, Ceiling string
}

func (c *Clamped) Error() string {
	return fmt.Sprintf("%s=%s: above the operator's ceiling; clamped to %s", c.Source, quote(c.Value), c.Ceiling)
}

// Clamp lowers p's value of key (set from an annotation) to its ceiling.
// limitMilli is the container's CPU limit (0: none). It returns a
// *Clamped when it lowered the value, else nil.
func (c Ceilings) Clamp(key string, p *Pool, limitMilli uint32) error {
	before := p.Get(key)
	switch key {
	case "pool.maxSlots":
		if c.MaxSlots > 0 {
			p.MaxSlots = min(p.MaxSlots, c.MaxSlots)
		}
	case "pool.prewarm":
		if c.PrewarmSlots > 0 {
			p.Prewarm = clampPrewarm(p.Prewarm, c.PrewarmSlots)
		}
	case "admission.overcommit":
		if c.Overcommit > 0 {
			p.Overcommit = min(p.Overcommit, c.Overcommit)
		}
	case "admission.lendRatio":
		if c.LendRatio > 0 {
			p.LendRatio = min(p.LendRatio, c.LendRatio)
		}
	case "admission.budget":
		ceil := c.BudgetMilli
		if ceil == 0 {
			ceil = limitMilli
		}
		budget := p.BudgetMilli
		if budget == 0 {
			budget = limitMilli // 0: unlimited
		}
		if ceil > 0 && (budget == 0 || budget > ceil) {
			p.BudgetMilli = ceil
		}
	}
	if after := p.Get(key); after != before {
		return &Clamped{Value: before, Ceiling: after}
	}
	return nil
}

// clampPrewarm keeps at most n slots of prewarm, the smallest quotas
// first (they cost least).
func clampPrewarm(prewarm map[uint32]int, n int) map[uint32]int {
	quotas := make([]uint32, 0, len(prewarm))
	for q := range prewarm {
		quotas = append(quotas, q)
	}
	slices.Sort(quotas)
	out := make(map[uint32]int, len(prewarm))
	for _, q := range quotas {
		k := min(prewarm[q], n)
		out[q] = k
		n -= k
	}
	return out
}
