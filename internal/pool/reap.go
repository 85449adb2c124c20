package pool

import (
	"log/slog"
	"time"

	"github.com/cpuslot/cpuslot/internal/metrics"
)

// Reap removes grown slots that stayed free longer than the idle timeout,
// keeping the pre-warmed count of each quota, free slots above the
// container's CPU limit (it was lowered), and retired slots not removed yet.
func (p *Pool) Reap(now time.Time) int {
	p.settleDue(now)
	max := p.maxQuota()
	p.mu.Lock()
	count := map[uint32]int{}
	for _, s := range p.slots {
		count[s.spec.QuotaMilli]++
	}
	var victims []*slot
	for _, s := range p.slots {
		q := s.spec.QuotaMilli
		idle := count[q] > p.cfg.Prewarm[q] && now.Sub(s.freeSince) >= p.cfg.IdleTimeout
		if !p.closed && s.lease == nil && !s.busy && (idle || q > max || s.retired) {
			count[q]--
			s.busy = true
			victims = append(victims, s)
			p.beginIO()
		}
	}
	p.mu.Unlock()
	for _, s := range victims {
		why := "idle"
		if s.retired {
			why = "retired"
		} else if s.spec.QuotaMilli > max {
			why = "above the container's CPU limit of " + FormatQuota(max)
		}
		p.removeSlot(s, why)
	}
	p.mu.Lock()
	for range victims {
		p.endIO()
	}
	p.mu.Unlock()
	return len(victims)
}

// removeSlot removes a slot the caller made busy (or that nobody else sees).
func (p *Pool) removeSlot(s *slot, why string) {
	err := s.io.Remove()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.metrics.Error(metrics.RemoveFailed)
		s.busy = false // try again at the next reap
		return
	}
	if s.occupant != (Thread{}) {
		delete(p.byThread, s.occupant)
	}
	delete(p.slots, s.id)
	slog.Info("slot removed", "container", p.name, "slot", s.id, "quota", FormatQuota(s.spec.QuotaMilli), "reason", why)
	p.broadcast()
}
