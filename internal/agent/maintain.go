package agent

// Maintenance rounds: idle slots reaped, gone containers dropped, the
// slots of torn-down containers removed once they can be (leftovers), and
// other containers' threads moved out of exposed slots.

import (
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/metrics"
)

// maintainHook, when set by a test, runs at the start of each maintenance
// round.
var maintainHook func()

// leftover is a torn-down container with slots still to remove, and how
// many maintenance rounds have tried.
type leftover struct {
	s      *served
	rounds int
}

// leftoverRounds bounds the maintenance rounds that retry a leftover's
// slots: a container's process ends within its grace period.
const leftoverRounds = 60

func (a *Agent) teardown(s *served) {
	if s.ln != nil {
		s.ln.Close() // also removes the socket file
	}
	if err := s.pool.Close(true); errors.Is(err, cgroup.ErrBusy) {
		// The container's threads still enter its slots (it is ending: its
		// pod deleted): removed at the next maintenance rounds, so that
		// nothing of ours keeps its cgroup from going.
		a.mu.Lock()
		a.leftover = append(a.leftover, leftover{s: s})
		a.mu.Unlock()
		a.log.Info("slots not removed yet (err says why); tried again at the next maintenance rounds", "container", s.Name, "err", err)
		return
	} else if err != nil {
		a.metrics.Error(metrics.TeardownFailed)
		a.log.Error("removing slots", "container", s.Name, "err", err)
		return
	}
	a.log.Info("stopped serving container; slots removed", "container", s.Name)
}

// removeLeftovers tries again to remove the slots of torn-down containers
// whose threads kept entering them.
func (a *Agent) removeLeftovers() {
	a.mu.Lock()
	left := a.leftover
	a.leftover = nil
	a.mu.Unlock()
	var again []leftover
	for _, l := range left {
		l.rounds++
		done, err := l.s.pool.RemoveLeft(l.rounds >= leftoverRounds)
		switch {
		case !done:
			again = append(again, l)
		case err != nil:
			a.metrics.Error(metrics.TeardownFailed)
			a.log.Error("removing slots", "container", l.s.Name, "rounds", l.rounds, "err", err)
		default:
			a.log.Info("stopped serving container; slots removed", "container", l.s.Name, "rounds", l.rounds)
		}
	}
	if len(again) > 0 {
		a.mu.Lock()
		a.leftover = append(a.leftover, again...)
		a.mu.Unlock()
	}
}

// Maintain reaps idle grown slots, drops pools of containers that are
// gone or were made anew, and tears down auto-served containers no thread
// is left in.
func (a *Agent) Maintain(now time.Time) {
	if maintainHook != nil {
		maintainHook()
	}
	a.removeLeftovers()
	for _, s := range a.snapshot() {
		id, err := a.hierarchy.IdentityOf(s.CgroupPath)
		if err != nil {
			a.log.Info("container is gone", "container", s.Name)
			a.teardownListener(s) // before the pool leaves the list
			a.drop(s)
			continue
		}
		if id != s.cg.Identity() || s.pool.Stale() {
			if a.current(s) == nil && !s.auto {
				// A container the sources named: serve the new cgroup.
				if _, err := a.serveWith(s.Container, false, s.ln); err != nil {
					a.log.Warn("serving a container made anew", "container", s.Name, "err", err)
				}
			}
			continue
		}
		if s.auto {
			if busy, err := s.cg.Populated(); err == nil && !busy {
				a.log.Info("no process left in container", "container", s.Name)
				a.Forget(s.CgroupPath)
				continue
			}
		}
		// An in-place resize changes the container's CPU limit: refused
		// quotas, the budget and the slots follow it (the reap below
		// removes free slots above a lowered limit).
		if _, _, err := s.pool.RefreshLimit(); err != nil {
			a.log.Warn("following the container's CPU limit", "container", s.Name, "err", err)
		}
		if n := s.pool.Reap(now); n > 0 {
			a.log.Debug("reaped idle slots", "container", s.Name, "slots", n)
		}
	}
	a.evictForeign(false)
	a.server.RecheckFDs()
}

// The foreign-thread scan's bounds (docs/security.md): threads checked
// per maintenance round on the node, and per container within those
// (variables for tests only).
var (
	foreignScanPerRound     = 4096
	foreignScanPerContainer = 512
)

// leasedScanInterval is how often the exposed slots leased now are
// scanned between maintenance rounds.
const leasedScanInterval = time.Second

// evictForeign finds threads of other containers in the slots of served
// containers (v1: a slot's placement fd moves any thread its holder can
// name) and moves them back to their own cgroups. It looks only in slots
// whose fds a client may hold (pool.Exposed; leased: those leased now),
// so a node whose clients take no fds costs nothing. Containers take
// turns: a round that runs out of its bound goes on at the next container
// next time.
func (a *Agent) evictForeign(leased bool) {
	if a.hierarchy.ConfinesFDs() {
		return // the kernel keeps threads in their own threaded subtree
	}
	all := a.snapshot()
	if len(all) == 0 {
		return
	}
	a.mu.Lock()
	start := a.scanNext % len(all)
	a.mu.Unlock()
	budget, next := foreignScanPerRound, start
	for k := 0; k < len(all) && budget > 0; k++ {
		i := (start + k) % len(all)
		s := all[i]
		next = i + 1
		sc, err := s.cg.EvictForeignIn(s.pool.Exposed(leased), min(budget, foreignScanPerContainer))
		budget -= sc.Checked
		if err != nil {
			a.log.Debug("scanning slots for foreign threads", "container", s.Name, "err", err)
			continue
		}
		a.foreignFound(s.Name, s.CgroupPath, sc.Foreign)
		a.retire(s, sc.Foreign)
	}
	a.mu.Lock()
	a.scanNext = next
	a.mu.Unlock()
}

// retire makes the fds of slots that held foreign threads useless (v1):
// the container's clients are refused fds for a while and its fd
// connections closed, which ends their leases, and each such slot's
// cgroup is removed as soon as it is free, so every fd opened to it,
// passed on or not, fails from then on.
func (a *Agent) retire(s *served, found []cgroup.Foreign) {
	if len(found) == 0 {
		return
	}
	s.pool.RevokeFDs(time.Now())
	n := a.server.RevokeFDs(s.pool)
	slots := map[uint32]bool{}
	for _, f := range found {
		if id, ok := cgroup.ParseSlotName(f.Slot); ok && !slots[id] {
			slots[id] = true
			s.pool.Retire(id)
		}
	}
	a.log.Warn("slot fds revoked: slots retired, fd connections closed, threads placed by the agent for a while",
		"container", s.Name, "slots", len(slots), "connections", n)
}

// foreignFound counts the foreign threads found in one container's slots
// at once, logs the first and reports it to the pods involved: a tenant
// that writes threads back in every round makes one log line and one
// Event per round, not one per thread.
func (a *Agent) foreignFound(name, cgroupPath string, found []cgroup.Foreign) {
	if len(found) == 0 {
		return
	}
	a.metrics.ErrorN(metrics.ForeignThreadInSlot, len(found))
	f := found[0]
	slot := path.Join(cgroupPath, f.Slot)
	what := "moved back to " + f.MovedTo
	if f.Err != nil {
		what = "not moved: " + f.Err.Error()
		a.log.Error("thread of another cgroup in a slot; not moved", "container", name, "slot", slot,
			"tid", f.TID, "pid", f.PID, "home", f.Home, "err", f.Err, "found", len(found))
	} else {
		a.log.Warn("thread of another cgroup in a slot (the slot's fds were passed on); moved back", "container", name,
			"slot", slot, "tid", f.TID, "pid", f.PID, "home", f.Home, "movedTo", f.MovedTo, "found", len(found))
	}
	more := ""
	if len(found) > 1 {
		more = fmt.Sprintf(" (and %d more threads found in this round)", len(found)-1)
	}
	for _, r := range a.reporters {
		r.Report(cgroupPath, discover.ReasonForeignThread, fmt.Sprintf(
			"thread %d of process %d (cgroup %s) ran in slot %s of this container, whose placement fds were passed to it; %s%s",
			f.TID, f.PID, f.Home, f.Slot, what, more))
		if f.Home != "" {
			r.Report(f.Home, discover.ReasonForeignThread, fmt.Sprintf(
				"thread %d of process %d wrote itself into slot %s of container %s with that container's fds; %s%s",
				f.TID, f.PID, f.Slot, name, what, more))
		}
	}
}
