package server

import (
	"log/slog"
	"os"
	"path"
	"sync"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/proc"
)

// selfGuard checks, after agent placements, that no thread of the agent
// sits in a slot (a TID reused between its check and the write could
// otherwise move one), and moves any it finds back. Checks run in the
// background and coalesce, so placements do not wait for them.
type selfGuard struct {
	h       *cgroup.Hierarchy
	metrics *metrics.Metrics
	log     *slog.Logger
	once    sync.Once
	kick    chan struct{}
}

func newSelfGuard(h *cgroup.Hierarchy, m *metrics.Metrics, log *slog.Logger) *selfGuard {
	return &selfGuard{h: h, metrics: m, log: log, kick: make(chan struct{}, 1)}
}

// check schedules a scan of the agent's threads.
func (g *selfGuard) check() {
	g.once.Do(func() { go g.run() })
	select {
	case g.kick <- struct{}{}:
	default: // a scan is pending; it sees this placement too
	}
}

func (g *selfGuard) run() {
	for range g.kick {
		if n := g.scan(); n > 0 {
			g.metrics.Error(metrics.AgentThreadInSlot)
		}
		// Placements meanwhile wait for one scan after this pause: under a
		// flood of agent placements back-to-back scans took 40% of the
		// agent's CPU (a read of /proc per agent thread each).
		time.Sleep(guardPause)
	}
}

// guardPause is the least time between two scans of the agent's threads:
// an agent thread a reused TID moved into a slot runs there at most about
// this long, and scans cost at most a read per agent thread this often.
const guardPause = 10 * time.Millisecond

// scan moves agent threads found in a slot back to the agent's own cgroup
// and returns how many it found.
func (g *selfGuard) scan() int {
	self := os.Getpid()
	home, err := g.h.PathOfPID(self)
	if err != nil || inSlot(home) {
		home = "/"
	}
	tids, err := proc.Threads(self)
	if err != nil {
		return 0
	}
	found := 0
	for _, tid := range tids {
		p, err := g.h.PathOfThread(self, tid)
		if err != nil || !inSlot(p) {
			continue
		}
		found++
		err = g.h.MoveThread(tid, home)
		g.log.Error("an agent thread was in a slot; moved back", "tid", tid, "slot", p, "to", home, "err", err)
	}
	return found
}

func inSlot(p string) bool {
	_, ok := cgroup.ParseSlotName(path.Base(p))
	return ok
}
