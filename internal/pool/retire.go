package pool

import (
	"sort"
	"time"

	"github.com/cpuslot/cpuslot/internal/outcome"
)

// On cgroup v1 a slot's placement fd outlives its lease: whoever it was
// passed to can write threads into the slot for as long as the cgroup
// lives. A slot found holding a thread that is not its container's is
// retired: its cgroup is removed (its threads moved out first), which
// makes every fd opened to it fail, and the pool makes new slots as it
// needs them. The container's clients are refused fds for fdQuarantine.

// fdQuarantine is how long a container whose slot held a foreign thread
// is served by agent placement only, the first time. Each later time,
// after a quarantine ended, doubles it up to maxFDQuarantine: that the
// container's fds reached another cgroup once more shows whatever passed
// them on is still there, and the agent cannot prove it gone.
const (
	fdQuarantine    = 10 * time.Minute
	maxFDQuarantine = 24 * time.Hour
)

// Retire removes slot id's cgroup: a lease on it ends now (its holder's
// next RELEASE finds no lease), and the slot goes as it is freed; a slot
// busy with other I/O goes at the next Reap. It reports whether the slot
// was known.
func (p *Pool) Retire(id uint32) bool {
	p.mu.Lock()
	s := p.slots[id]
	if s == nil {
		p.mu.Unlock()
		return false
	}
	s.retired = true
	if l := s.lease; l != nil {
		p.mu.Unlock()
		// Ended as its closed connection would end it: the connection
		// holding it may be one that is not closed (it took no fds).
		p.Release(l.owner, l.id, outcome.Abandoned) // freeSlot hands it on
		return true
	}
	if s.busy {
		p.mu.Unlock()
		return true
	}
	s.busy = true
	p.beginIO()
	p.mu.Unlock()
	p.removeRetired(s)
	return true
}

// removeRetired removes a retired slot the caller made busy.
func (p *Pool) removeRetired(s *slot) {
	p.removeSlot(s, "a thread of another cgroup was found in it (its fds were passed on)")
	p.mu.Lock()
	p.endIO()
	p.mu.Unlock()
}

// RevokeFDs refuses the container's clients placement fds for its
// quarantine from now. A finding during a quarantine is part of the same
// incident (slots exposed before it began): it extends the quarantine,
// it does not double it.
func (p *Pool) RevokeFDs(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.fdsRevokedAt(now) {
		p.fdIncidents++
	}
	d := maxFDQuarantine
	if n := p.fdIncidents - 1; n < 8 && fdQuarantine<<n < maxFDQuarantine {
		d = fdQuarantine << n
	}
	if until := now.Add(d).UnixNano(); until > p.fdsRevoked.Load() {
		p.fdsRevoked.Store(until)
	}
}

// FDsRevoked reports whether the container's clients are refused fds.
func (p *Pool) FDsRevoked() bool { return p.fdsRevokedAt(time.Now()) }

func (p *Pool) fdsRevokedAt(now time.Time) bool { return now.UnixNano() < p.fdsRevoked.Load() }

// Exposed lists the slots that can hold a foreign thread (v1): those
// whose threads placed themselves, with fds that outlive the lease, and
// those an earlier agent left. leased: only those leased now, where a
// holder is at work.
func (p *Pool) Exposed(leased bool) []uint32 {
	p.mu.Lock()
	var ids []uint32
	if leased {
		// Through the leases: nothing to walk on an idle node.
		for _, l := range p.leases {
			if l.slot.exposed {
				ids = append(ids, l.slot.id)
			}
		}
	} else {
		for _, s := range p.slots {
			if s.exposed {
				ids = append(ids, s.id)
			}
		}
	}
	p.mu.Unlock()
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}
