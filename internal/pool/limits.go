package pool

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cpuslot/cpuslot/internal/admission"
)

// maxQuota is the largest quota a request may ask for: the container's
// CPU limit, else the configured maximum (by default the node's CPUs).
func (p *Pool) maxQuota() uint32 {
	if l := p.limit(); l > 0 {
		return l
	}
	return p.cfg.MaxQuotaMilli
}

// limit is the container's CPU limit the pool serves within (0: none): the
// cgroup's, or the one its orchestrator asks for when that is lower.
func (p *Pool) limit() uint32 {
	c, a := p.containerLimit.Load(), p.askedLimit.Load()
	if c == 0 || (a > 0 && a < c) {
		return a
	}
	return c
}

// RefreshLimit re-reads the container's CPU limit, which an in-place
// resize changes while the container runs, and returns the limit before
// and now (0: none). Under a lower limit requests above it are refused
// (INVALID_QUOTA, as for a container that started with that limit), a
// budget that follows the limit shrinks, and Reap removes the free slots
// above it; a leased one goes once it is released (until then the kernel
// caps it at the container's limit anyway). Under a higher limit the
// budget grows and the pre-warmed slots that fit again are made.
func (p *Pool) RefreshLimit() (before, now uint32, err error) {
	now, err = p.backend.LimitMilli()
	if err != nil {
		return 0, 0, fmt.Errorf("reading the container's CPU limit: %w", err)
	}
	before = p.containerLimit.Load()
	if now == before {
		return before, now, nil
	}
	return before, now, p.setLimit(&p.containerLimit, now, "container CPU limit changed")
}

// AskLimit is the CPU limit the container's orchestrator asks for before
// the kernel has it (a resize in the pod's spec; 0: none). Below the
// cgroup's limit the pool serves within it at once, and the free slots
// above it are removed now: cgroup v1 refuses a container a quota below a
// child's, so they would make the resize fail.
func (p *Pool) AskLimit(milli uint32) error {
	if p.askedLimit.Load() == milli {
		return nil
	}
	err := p.setLimit(&p.askedLimit, milli, "container CPU limit asked")
	p.Reap(time.Now())
	return err
}

// setLimit stores one of the pool's limits and applies what changed: the
// budget (when it follows the limit), waiting requests, and the pre-warmed
// slots that fit again under a higher limit.
func (p *Pool) setLimit(which *atomic.Uint32, milli uint32, what string) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	before, maxBefore := p.limit(), p.maxQuota()
	which.Store(milli)
	now := p.limit()
	if p.cfg.BudgetMilli == 0 && now != before {
		// Leases granted under the old budget keep their share of it.
		b := admission.New(now, p.cfg.Overcommit, p.cfg.Policy, p.cfg.MinDegradedMilli)
		b.Take(p.budget.Used())
		p.budget = b
	}
	raises := p.planRaises()
	p.broadcast() // waiting requests see the new limit and budget
	p.mu.Unlock()
	p.raise(raises)
	slog.Info(what, "container", p.name, "to", formatLimit(milli), "servedWithin", formatLimit(now), "was", formatLimit(before))
	if p.maxQuota() > maxBefore && p.mode.keepsSlots() {
		return p.prewarm(false)
	}
	return nil
}

func formatLimit(m uint32) string {
	if m == 0 {
		return "none"
	}
	return FormatQuota(m)
}
