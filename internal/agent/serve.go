package agent

// Serving a container: its pool made once (prepare), its socket, its CPU
// limit followed, and its pool dropped when it is forgotten or gone; the
// containers an earlier agent left below serveUnder adopted.

import (
	"errors"
	"fmt"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/pool"
	"github.com/cpuslot/cpuslot/internal/server"
)

// Prepare prepares a container's pool (discover.Sink). A *discover.Partial
// error means it is served, but not as configured.
func (a *Agent) Prepare(c discover.Container) error {
	_, err := a.serve(c, false)
	return err
}

func (a *Agent) serve(c discover.Container, auto bool) (*served, error) {
	return a.serveWith(c, auto, nil)
}

// serveWith serves c, reusing the container socket ln when it is given (a
// pool made anew for a container that keeps its socket). The cgroup I/O of
// making the pool runs without the agent lock: other containers are served
// meanwhile.
func (a *Agent) serveWith(c discover.Container, auto bool, ln *server.Listener) (*served, error) {
	if c.Socket == "" {
		c.Socket = a.containerSocket(c.CgroupPath)
	}
	for {
		a.mu.Lock()
		if s := a.containers[c.CgroupPath]; s != nil {
			a.mu.Unlock()
			return s, nil
		}
		if pr := a.preparing[c.CgroupPath]; pr != nil {
			a.mu.Unlock()
			<-pr.done
			if pr.s == nil || pr.forgotten {
				return nil, pr.err
			}
			continue
		}
		if max := a.cfg.MaxContainers; len(a.containers)+len(a.preparing) >= max {
			a.mu.Unlock()
			a.metrics.Error(metrics.ContainersExhausted)
			return nil, fmt.Errorf("container %s: %w (%d)", c.Name, ErrTooManyContainers, max)
		}
		pr := &preparation{done: make(chan struct{})}
		a.preparing[c.CgroupPath] = pr
		a.mu.Unlock()

		s, err := a.prepare(c, auto, ln)

		a.mu.Lock()
		delete(a.preparing, c.CgroupPath)
		forgotten := pr.forgotten
		if s != nil && !forgotten {
			a.containers[c.CgroupPath] = s
		}
		pr.s, pr.err = s, err
		a.mu.Unlock()
		close(pr.done)
		if s != nil && forgotten {
			a.teardown(s)
			return nil, fmt.Errorf("container %s: no longer to be served", c.Name)
		}
		if s != nil && c.FirstSlots {
			go a.prewarmRest(s)
		}
		return s, err
	}
}

// prewarmRest makes the pre-warmed slots a pool started with its first
// slots only still lacks.
func (a *Agent) prewarmRest(s *served) {
	if err := s.pool.Prewarm(); err != nil {
		a.metrics.Error(metrics.PrewarmFailed)
		a.log.Warn("pre-warming incomplete", "container", s.Name, "err", err)
	}
}

// prepareHook, when set by a test, runs before a container's pool is made.
var prepareHook func(cgroupPath string)

// prepare makes a container's pool: adopt, pre-warm, listen.
func (a *Agent) prepare(c discover.Container, auto bool, ln *server.Listener) (*served, error) {
	if prepareHook != nil {
		prepareHook(c.CgroupPath)
	}
	cg, err := a.hierarchy.Container(c.CgroupPath, a.metrics.CgroupOp)
	if err != nil {
		a.metrics.Error(metrics.ContainerNotFound)
		return nil, fmt.Errorf("container %s: %w", c.Name, err)
	}
	pinned := time.Now()
	cg.OnForeign(func(f cgroup.Foreign) { a.foreignFound(c.Name, c.CgroupPath, []cgroup.Foreign{f}) })
	cfg := a.poolCfg
	if c.Pool != nil {
		cfg = *c.Pool
	}
	p, err := pool.New(c.Name, cfg, pool.CgroupBackend(cg), a.metrics)
	if err != nil {
		cg.Close()
		a.metrics.Error(metrics.PoolConfig)
		return nil, fmt.Errorf("container %s: %w", c.Name, err)
	}
	start := time.Now()
	var partial error
	startPool := p.Start
	if c.FirstSlots {
		startPool = p.StartFirst
	}
	if err := startPool(); err != nil {
		// The pool still serves: slots are created on demand.
		a.metrics.Error(metrics.PrewarmFailed)
		a.log.Warn("pre-warming incomplete", "container", c.Name, "err", err)
		partial = &discover.Partial{Err: err}
	}
	s := &served{Container: c, pool: p, cg: cg, pinned: pinned, auto: auto, ln: ln}
	if c.Socket != "" && ln == nil {
		ln, err := server.Listen(c.Socket)
		if err != nil {
			a.metrics.Error(metrics.SocketFailed)
			p.Close(true)
			return nil, fmt.Errorf("container %s: socket %s: %w", c.Name, c.Socket, err)
		}
		s.ln = ln
		go a.server.ServeWith(ln, containerResolver{a, c.CgroupPath})
	}
	sum := p.Summary()
	a.log.Info("serving container", "container", c.Name, "cgroup", c.CgroupPath, "mode", sum.Mode,
		"budget", sum.BudgetMilli, "slots", countSlots(sum), "socket", c.Socket, "took", time.Since(start).Round(time.Microsecond).String())
	if !a.hierarchy.ConfinesFDs() && cg.Witness() == nil {
		a.log.Warn("the container's cgroup exists in no v1 hierarchy but cpu and cpuacct: a thread of another container in its slots is found only by its process leader's cgroup, which the holder of passed fds can move too (docs/security.md)",
			"container", c.Name, "cgroup", c.CgroupPath)
	}
	if partial != nil {
		return s, partial
	}
	return s, nil
}

// current returns the pool serving s, or nil when s's cgroup is gone or
// was made anew at its path (then s is dropped; the caller serves again).
func (a *Agent) current(s *served) *pool.Pool {
	a.mu.Lock()
	p := s.pool
	a.mu.Unlock()
	if !p.Stale() && s.cg.Exists() {
		return p
	}
	a.log.Info("container cgroup was removed or made anew; dropping its pool", "container", s.Name)
	a.drop(s)
	return nil
}

// drop forgets s without touching the cgroup now at its path: its own
// cgroup is gone, and its slots with it.
func (a *Agent) drop(s *served) {
	a.mu.Lock()
	if a.containers[s.CgroupPath] == s {
		delete(a.containers, s.CgroupPath)
	}
	a.mu.Unlock()
	s.pool.Invalidate()
	go s.pool.Close(true) // waits for I/O in progress on the old cgroup
}

func countSlots(s pool.Summary) int {
	n := 0
	for _, q := range s.Quotas {
		n += q.Slots
	}
	return n
}

// Forget tears a container's pool down and removes its slots
// (discover.Sink).
func (a *Agent) Forget(cgroupPath string) {
	a.mu.Lock()
	s := a.containers[cgroupPath]
	if s != nil {
		// The socket goes before the pool leaves the list: a pool no
		// longer listed has no socket left.
		a.teardownListener(s)
	}
	delete(a.containers, cgroupPath)
	if pr := a.preparing[cgroupPath]; pr != nil {
		pr.forgotten = true // torn down once made
	}
	a.mu.Unlock()
	if s != nil {
		a.teardown(s)
	}
}

// Resize serves a container within the CPU limit its orchestrator now
// asks for (discover.Sink).
func (a *Agent) Resize(cgroupPath string, limitMilli uint32) {
	a.mu.Lock()
	s := a.containers[cgroupPath]
	a.mu.Unlock()
	if s == nil {
		return
	}
	if err := s.pool.AskLimit(limitMilli); err != nil {
		a.log.Warn("following the container's asked CPU limit", "container", s.Name, "err", err)
	}
}

// serveError is what a client is told when its container cannot be served:
// at the cap on containers it may say HELLO again later (NOT_READY).
func serveError(ctr string, err error) error {
	if errors.Is(err, ErrTooManyContainers) {
		return &server.NotReady{Reason: err.Error(), RetryAfter: time.Second}
	}
	return &server.NotServed{Reason: fmt.Sprintf("preparing %s: %v", ctr, err)}
}

func (a *Agent) teardownListener(s *served) {
	if s.ln != nil {
		s.ln.Close()
	}
}

// adoptServeUnder finds the slots left below serveUnder cgroups by an
// earlier agent: a container with a process left is served again (its
// runtime may hold leases and will reconnect); the slots of a container
// with none are removed, or nobody would (the container's runtime could not
// remove its cgroup: EBUSY).
func (a *Agent) adoptServeUnder() {
	for _, root := range a.cfg.Standalone.ServeUnder {
		parents, err := a.hierarchy.SlotParents(root)
		if err != nil {
			a.log.Warn("scanning for slots left by an earlier agent", "under", root, "err", err)
			continue
		}
		for _, p := range parents {
			if p == root || !within(p, root) {
				continue
			}
			cg, err := a.hierarchy.Container(p, a.metrics.CgroupOp)
			if err != nil {
				continue
			}
			busy, err := cg.Populated()
			if err != nil || busy {
				cg.Close()
				if _, err := a.serve(discover.Container{Name: p, CgroupPath: p}, true); err != nil {
					a.log.Warn("adopting a container left by an earlier agent", "container", p, "err", err)
				}
				continue
			}
			n, err := cg.RemoveSlots()
			cg.Close()
			if err != nil {
				a.metrics.Error(metrics.TeardownFailed)
				a.log.Warn("removing slots of a container with no process", "container", p, "err", err)
				continue
			}
			a.log.Info("removed slots left in a container with no process", "container", p, "slots", n)
		}
	}
}
