// Package agent wires cpuslot's node agent: it serves the containers its
// sources discover, resolves each connecting process to its container's
// pool, reaps idle slots and gone containers, and exposes health, metrics
// and pool state over HTTP.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
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
	// pinned is when cg was pinned (a time before it was served): a peer
	// read in its path after then, while cg still exists, was in cg.
	pinned time.Time
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
		h.SetKeptFDs(int(min(lim.Cur/2, 1<<30)))
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
	var busy []*served
	for _, s := range a.snapshot() {
		if err := s.pool.Close(cleanup); cleanup && errors.Is(err, cgroup.ErrBusy) {
			busy = append(busy, s)
		} else if err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, removeBusyAtStop(busy)...)
	a.removeLeftovers() // once more: their containers may be gone by now
	a.log.Info("agent stopped", "removedSlots", cleanup)
	return errors.Join(errs...)
}

// stopWait bounds how long a stopping agent retries the slots whose threads
// were still leaving them: a thread that is exiting is moved by no one and
// leaves its cgroup once its exit is through. Only at the stop: maintenance
// retries leftovers over its rounds instead, so that no container's threads
// hold up the rounds of the others.
const stopWait = time.Second

// removeBusyAtStop retries the left slots of each pool in busy until they
// are removed or stopWait has passed (then they are given up), and returns
// what failed.
func removeBusyAtStop(busy []*served) []error {
	var errs []error
	until := time.Now().Add(stopWait)
	for len(busy) > 0 {
		last := !time.Now().Before(until)
		var again []*served
		for _, s := range busy {
			done, err := s.pool.RemoveLeft(last)
			if !done {
				again = append(again, s)
			} else if err != nil {
				errs = append(errs, err)
			}
		}
		if busy = again; len(busy) > 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return errs
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
