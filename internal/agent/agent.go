// Package agent wires cpuslot's node agent: it serves the containers its
// sources discover, resolves each connecting process to its container's
// pool, reaps idle slots and gone containers, and exposes health, metrics
// and pool state over HTTP.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/health"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/pool"
	"github.com/cpuslot/cpuslot/internal/server"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// Version is set at build time.
var Version = "dev"

// Agent is one node agent.
type Agent struct {
	cfg       Config
	poolCfg   settings.Pool
	hierarchy *cgroup.Hierarchy
	registry  *prometheus.Registry
	metrics   *metrics.Metrics
	log       *slog.Logger
	server    *server.Server

	// mu guards the maps only: no cgroup I/O runs under it.
	mu         sync.Mutex
	containers map[string]*served // by cgroup path
	// preparing are containers whose pools are being made.
	preparing map[string]*preparation
	// leftover are torn-down containers whose slots could not be removed
	// yet: threads kept arriving (the container's process ending while it
	// places its threads itself) or a cgroup sits inside one; Maintain
	// removes them once that is gone.
	leftover []leftover
	// scanNext is the container the next foreign-thread scan starts at.
	scanNext int
	// reporters are the sources that tell a container's owner (Events).
	reporters []discover.Reporter
	ready     atomic.Bool
	// maintenance is the loop of Run (maintenance rounds and the scan of
	// leased slots); checkers are the server's accept loops and the
	// sources' loops: /healthz fails when one stalls.
	maintenance health.Loop
	checkers    []health.Checker
}

// ErrTooManyContainers means the agent serves its maximum of containers
// (maxContainers): it bounds the memory and fds the agent spends.
var ErrTooManyContainers = errors.New("the agent serves its maximum number of containers")

type preparation struct {
	done      chan struct{}
	s         *served
	err       error
	forgotten bool // Forget came while the pool was being made
}

type served struct {
	discover.Container
	pool *pool.Pool
	// cg is the container's cgroup, pinned by its directory fds: a cgroup
	// made anew at the same path is another container.
	cg *cgroup.Container
	// ln is the container's own socket, if it has one.
	ln *server.Listener
	// auto marks containers prepared on first contact (serveUnder): they
	// are torn down once no thread is left in them.
	auto bool
}

// New checks the configuration and the node's cgroups.
func New(cfg Config, log *slog.Logger) (*Agent, error) {
	pc, err := cfg.Settings()
	if err != nil {
		return nil, err
	}
	if err := cfg.checkLimits(); err != nil {
		return nil, err
	}
	h, err := cgroup.Detect()
	if err != nil {
		return nil, err
	}
	for _, p := range cfg.Standalone.ServeUnder {
		if !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("standalone.serveUnder %q: must be an absolute cgroup path", p)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)
	m.Info(fmt.Sprintf("v%d", h.Version), h.FavorDynMods, Version)
	if cfg.MaxContainers < 1 {
		return nil, fmt.Errorf("maxContainers %d: must be at least 1", cfg.MaxContainers)
	}
	m.SetMaxActions(cfg.MaxContainers * pc.MaxActions)
	// Slots keep their files open within half the fd limit; the rest is
	// for connections and everything else.
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil {
		cgroup.SetKeptFDs(int(min(lim.Cur/2, 1<<30)))
	}
	a := &Agent{cfg: cfg, poolCfg: pc, hierarchy: h, registry: reg, metrics: m, log: log,
		containers: map[string]*served{}, preparing: map[string]*preparation{}}
	a.maintenance.Name = "maintenance loop"
	metrics.RegisterPools(reg, cfg.MaxContainers, a.poolGauges)
	a.server = server.New(a, h, m, log)
	a.server.SetLimits(cfg.ServerLimits())
	log.Info("cgroup hierarchy", "hierarchy", h.String())
	return a, nil
}

// Ready reports whether the agent listens and its sources have synced.
func (a *Agent) Ready() bool { return a.ready.Load() }

// CountError counts an error a source found (cpuslot_errors_total).
func (a *Agent) CountError(r metrics.Reason) { a.metrics.Error(r) }

// Hierarchy is the node's cpu hierarchy.
func (a *Agent) Hierarchy() *cgroup.Hierarchy { return a.hierarchy }

// Run serves until ctx ends, then closes connections and leaves slots in
// place for the next agent (or removes them with cleanup).
func (a *Agent) Run(ctx context.Context, sources []discover.Source, cleanup bool) error {
	a.raiseFileLimit()
	// Before anything is served: a slot emptied on any path reports.
	a.checkers = []health.Checker{a.server}
	for _, s := range sources {
		if r, ok := s.(discover.Reporter); ok {
			a.reporters = append(a.reporters, r)
		}
		if c, ok := s.(health.Checker); ok {
			a.checkers = append(a.checkers, c)
		}
	}
	if d := a.cfg.Standalone.SocketDir; d != "" {
		if err := openSocketDir(d); err != nil {
			return err
		}
	}
	var ln *server.Listener
	if a.cfg.Socket != "" {
		var err error
		if ln, err = server.Listen(a.cfg.Socket); err != nil {
			return fmt.Errorf("listening on %s: %w", a.cfg.Socket, err)
		}
	}
	var httpSrv *http.Server
	if a.cfg.HTTP != "" {
		hl, err := net.Listen("tcp", a.cfg.HTTP)
		if err != nil {
			if ln != nil {
				ln.Close()
			}
			return fmt.Errorf("listening on %s: %w", a.cfg.HTTP, err)
		}
		httpSrv = &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go httpSrv.Serve(hl)
	}
	if ln != nil {
		go a.server.Serve(ln)
	}
	a.adoptServeUnder()
	a.serveSocketDirs()
	for _, s := range sources {
		if err := s.Run(ctx, a); err != nil {
			a.log.Error("source reported errors", "err", err)
		}
	}
	a.ready.Store(true)
	a.log.Info("agent ready", "socket", a.cfg.Socket, "http", a.cfg.HTTP, "containers", len(a.snapshot()))

	tick := time.NewTicker(a.cfg.ReapInterval.Duration)
	defer tick.Stop()
	leased := time.NewTicker(leasedScanInterval)
	defer leased.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case now := <-tick.C:
			a.maintenance.Begin()
			a.Maintain(now)
			a.maintenance.End()
		case <-leased.C:
			a.maintenance.Begin()
			a.serveSocketDirs()
			a.evictForeign(true)
			a.maintenance.End()
		}
	}
	a.ready.Store(false)
	if ln != nil {
		ln.Close()
	}
	for _, s := range a.snapshot() {
		if s.ln != nil {
			s.ln.Close()
		}
	}
	a.server.Shutdown()
	if httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		httpSrv.Shutdown(sctx)
		cancel()
	}
	var errs []error
	for _, s := range a.snapshot() {
		if err := s.pool.Close(cleanup); err != nil {
			errs = append(errs, err)
		}
	}
	a.removeLeftovers() // once more: their containers may be gone by now
	a.log.Info("agent stopped", "removedSlots", cleanup)
	return errors.Join(errs...)
}

// raiseFileLimit lifts the soft RLIMIT_NOFILE to the hard limit: every
// connection and every slot holds descriptors.
func (a *Agent) raiseFileLimit() {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			a.log.Warn("cannot raise the open file limit", "err", err)
		}
	}
	a.log.Info("open file limit", "nofile", rl.Cur, "maxConnections", a.cfg.Limits.MaxConnections)
}

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

// maintainHook, when set by a test, runs at the start of each maintenance
// round.
var maintainHook func()

// minStall is the least time a loop's work in hand may take before
// /healthz calls it a stall (a variable for tests); the bound is 5
// maintenance rounds otherwise.
var minStall = time.Minute

// healthy reports a stalled loop: a maintenance round that does not end (a
// cgroup write that hangs, a lock never given back), an accept loop held
// up with a connection in hand, a source's worker that does not finish
// serving a pod. Each must end its work in hand within
// max(5 x reapInterval, minStall); waiting for work is no stall.
func (a *Agent) healthy(now time.Time) error {
	limit := max(5*a.cfg.ReapInterval.Duration, minStall)
	errs := []error{a.maintenance.Stalled(now, limit)}
	for _, c := range a.checkers {
		errs = append(errs, c.Stalled(now, limit))
	}
	return errors.Join(errs...)
}

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
	s := &served{Container: c, pool: p, cg: cg, auto: auto, ln: ln}
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

// containerResolver serves a container's own socket: the peer must be a
// process of that container.
type containerResolver struct {
	a          *Agent
	cgroupPath string
}

func (r containerResolver) Resolve(p server.Peer) (*pool.Pool, error) {
	pl, err := r.a.Resolve(p)
	if err != nil {
		return nil, err
	}
	r.a.mu.Lock()
	s := r.a.containers[r.cgroupPath]
	r.a.mu.Unlock()
	if s == nil || s.pool != pl {
		return nil, &server.NotServed{Reason: fmt.Sprintf("process %d is not in the container this socket belongs to", p.PID)}
	}
	return pl, nil
}

// Holds reports whether the peer is still a process of this socket's
// container, served by pl; it never prepares a pool.
func (r containerResolver) Holds(p server.Peer, pl *pool.Pool) bool {
	r.a.mu.Lock()
	s := r.a.containers[r.cgroupPath]
	r.a.mu.Unlock()
	return s != nil && s.pool == pl && r.a.Holds(p, pl)
}

// Processes lists the processes of the container pl serves.
func (r containerResolver) Processes(pl *pool.Pool) ([]int, error) { return r.a.Processes(pl) }

// Serving names the served container that holds cgroup cg.
func (r containerResolver) Serving(cg string) string { return r.a.Serving(cg) }

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

// Resolve finds the pool of a connecting process (server.Resolver).
func (a *Agent) Resolve(p server.Peer) (*pool.Pool, error) {
	cg, err := a.hierarchy.PathOfPID(p.PID)
	if err != nil {
		return nil, &server.NotServed{Reason: fmt.Sprintf("cannot read the cgroup of process %d: %v", p.PID, err)}
	}
	var best *served
	for {
		a.mu.Lock()
		var bestPath string
		best, bestPath = a.servingLocked(cg)
		// A container whose pool is being made is served once it is made.
		var wait *preparation
		for path, pr := range a.preparing {
			if within(cg, path) && len(path) > len(bestPath) {
				wait, bestPath = pr, path
			}
		}
		a.mu.Unlock()
		if wait == nil {
			break
		}
		<-wait.done
	}
	if best != nil {
		if p := a.current(best); p != nil {
			return p, nil
		}
		// Made anew at the same path: a new container, served afresh.
		s, err := a.serveWith(best.Container, best.auto, best.ln)
		if err != nil {
			return nil, serveError(best.CgroupPath, err)
		}
		return s.pool, nil
	}
	if a.underServeUnder(cg) {
		ctr := containerOf(cg)
		s, err := a.serve(discover.Container{Name: ctr, CgroupPath: ctr}, true)
		if err != nil {
			return nil, serveError(ctr, err)
		}
		return s.pool, nil
	}
	return nil, &server.NotServed{Reason: fmt.Sprintf("process %d in cgroup %s is not in a container this agent serves", p.PID, cg)}
}

// Holds reports whether the peer's process is still in the container
// that pl serves (server.Resolver). Unlike Resolve it never prepares a
// pool: a peer that moved to another cgroup below a serve-under root must
// not make the agent create slots there by asking for a placement.
func (a *Agent) Holds(p server.Peer, pl *pool.Pool) bool {
	cg, err := a.hierarchy.PathOfPID(p.PID)
	if err != nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	best, _ := a.servingLocked(cg)
	return best != nil && best.pool == pl && !pl.Stale()
}

// Processes lists the processes of the container pl serves, in its cgroup
// and below (server.Resolver).
func (a *Agent) Processes(pl *pool.Pool) ([]int, error) {
	a.mu.Lock()
	var cg *cgroup.Container
	for _, s := range a.containers {
		if s.pool == pl {
			cg = s.cg
			break
		}
	}
	a.mu.Unlock()
	if cg == nil {
		return nil, errors.New("container no longer served")
	}
	return cg.Processes()
}

// Serving names the served container that holds cgroup cg ("": none); it
// never prepares a pool (server.Resolver).
func (a *Agent) Serving(cg string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, path := a.servingLocked(cg)
	return path
}

// servingLocked is the served container that holds cgroup cg (the deepest
// one), and its path; a.mu is held.
func (a *Agent) servingLocked(cg string) (*served, string) {
	var best *served
	bestPath := ""
	for path, s := range a.containers {
		if within(cg, path) && len(path) >= len(bestPath) {
			best, bestPath = s, path
		}
	}
	return best, bestPath
}

// serveError is what a client is told when its container cannot be served:
// at the cap on containers it may say HELLO again later (NOT_READY).
func serveError(ctr string, err error) error {
	if errors.Is(err, ErrTooManyContainers) {
		return &server.NotReady{Reason: err.Error(), RetryAfter: time.Second}
	}
	return &server.NotServed{Reason: fmt.Sprintf("preparing %s: %v", ctr, err)}
}

// within reports whether cgroup path p is dir or below it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// containerOf strips a trailing slot from a process's cgroup path: a
// process whose main thread sits in a slot belongs to the slot's container.
func containerOf(p string) string {
	if _, ok := cgroup.ParseSlotName(path.Base(p)); ok {
		return path.Dir(p)
	}
	return p
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

func (a *Agent) snapshot() []*served {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*served, 0, len(a.containers))
	for _, s := range a.containers {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Summaries describes every pool.
func (a *Agent) Summaries() []pool.Summary {
	var out []pool.Summary
	for _, s := range a.snapshot() {
		out = append(out, s.pool.Summary())
	}
	return out
}

// poolGauges is the pools' state for a scrape.
func (a *Agent) poolGauges() []metrics.Pool {
	var out []metrics.Pool
	for _, s := range a.Summaries() {
		g := metrics.Pool{Container: s.Name, BudgetMilli: s.BudgetMilli, UsedMilli: s.UsedMilli, Leases: s.Leases,
			LentMilli: s.LentMilli, Wakes: s.Wakes, Lends: s.Lends, GiveBacks: s.GiveBacks, Cuts: s.Cuts}
		for _, q := range s.Quotas {
			g.Quotas = append(g.Quotas, metrics.Quota{Quota: pool.FormatQuota(q.QuotaMilli), Free: q.Free, Leased: q.Leased, Slots: q.Slots})
		}
		out = append(out, g)
	}
	return out
}

// fromLoopback reports whether r came from a loopback address: in a pod
// the agent's own network namespace, on the host the node. The address is
// the TCP peer's; nothing the client sends is believed.
func fromLoopback(r *http.Request) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// Handler serves /metrics, /healthz, /readyz and /debug/pools; the last
// only to loopback peers unless DebugPoolsRemote says otherwise: it names
// every container and its budget, and the port may be open on the pod
// network for /metrics.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{Registry: a.registry}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := a.healthy(time.Now()); err != nil {
			a.log.Error("unhealthy", "err", err)
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/debug/pools", func(w http.ResponseWriter, r *http.Request) {
		if !a.cfg.DebugPoolsRemote && !fromLoopback(r) {
			http.Error(w, "/debug/pools is served to loopback only (debugPoolsRemote)", http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(map[string]any{"hierarchy": a.hierarchy, "pools": a.Summaries()})
	})
	return mux
}
