package pool

import (
	"errors"
	"fmt"
	"time"
)

// Start adopts the slots an earlier agent left, retunes those made with
// other settings, and creates what the prewarm spec still lacks.
func (p *Pool) Start() error { return p.start(false) }

// StartFirst is Start that creates at most one slot of each pre-warmed
// quota, the least that serves a first invocation at every quota without a
// create; Prewarm makes the rest.
func (p *Pool) StartFirst() error { return p.start(true) }

// Prewarm creates what the prewarm spec still lacks.
func (p *Pool) Prewarm() error {
	if !p.mode.keepsSlots() {
		return nil
	}
	return p.prewarm(false)
}

func (p *Pool) start(first bool) error {
	adopted, err := p.backend.AdoptSlots()
	if err != nil {
		return fmt.Errorf("adopting existing slots: %w", err)
	}
	now := time.Now()
	p.mu.Lock()
	for id, io := range adopted {
		s := &slot{id: id, io: io, spec: io.Spec(), freeSince: now, adopted: true, exposed: true}
		p.slots[id] = s
		if id >= p.nextID {
			p.nextID = id + 1
		}
	}
	p.mu.Unlock()
	for _, s := range p.snapshotSlots() {
		want := s.spec
		want.PeriodUS, want.Limit = p.cfg.PeriodUS, p.cfg.Limit
		if !p.mode.keepsSlots() || want.Validate() != nil || want.QuotaMilli > p.maxQuota() {
			p.removeSlot(s, "adopted slot not usable by this pool")
			continue
		}
		if u, err := s.io.Usage(); err == nil {
			s.last = u
		}
		if want != s.spec {
			if err := s.io.Retune(want); err != nil {
				p.removeSlot(s, "adopted slot could not be retuned")
				continue
			}
			s.spec = want
		}
	}
	if !p.mode.keepsSlots() {
		return nil
	}
	return p.prewarm(first)
}

func (p *Pool) snapshotSlots() []*slot {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*slot, 0, len(p.slots))
	for _, s := range p.slots {
		out = append(out, s)
	}
	return out
}

// prewarm creates the slots the prewarm spec asks for and that are missing.
func (p *Pool) prewarm(first bool) error {
	have := map[uint32]int{}
	p.mu.Lock()
	for _, s := range p.slots {
		have[s.spec.QuotaMilli]++
	}
	p.mu.Unlock()
	var errs []error
	for q, n := range p.cfg.Prewarm {
		if first {
			n = min(n, 1)
		}
		if q > p.maxQuota() {
			errs = append(errs, fmt.Errorf("prewarm %dm is above the largest quota of %dm (the container's CPU limit, else the configured maximum)", q, p.maxQuota()))
			continue
		}
		for i := have[q]; i < n; i++ {
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				return errors.Join(errs...)
			}
			s := &slot{id: p.allocID(), spec: p.spec(q), busy: true}
			p.slots[s.id] = s
			p.beginIO()
			p.mu.Unlock()
			io, err := p.backend.CreateSlot(s.id, s.spec)
			p.mu.Lock()
			if err == nil {
				s.io, s.spec, s.busy, s.freeSince = io, io.Spec(), false, time.Now()
			} else {
				delete(p.slots, s.id)
			}
			p.endIO()
			p.mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return errors.Join(errs...)
}
