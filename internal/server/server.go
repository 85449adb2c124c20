// Package server speaks the slot protocol (api/slot/v1) on a Unix socket.
// Each connection is bound at HELLO to the container of the peer process,
// identified by SO_PEERCRED and that process's cgroup, so a client only ever
// gets slots of its own container.
//
// Its tests are here: those of package server against a pool, those of
// package server_test (attacks, local leasing, the fuzzer) against a live
// agent on real cgroups, through internal/agent/agenttest.
package server

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/health"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/pool"
	"github.com/cpuslot/cpuslot/internal/proc"
)

// Limits bound what peers can make the server hold (docs/security.md).
type Limits struct {
	// MaxConns is the most open connections of peers in no served
	// container (checked at accept); more are closed at accept.
	MaxConns int
	// MaxConnsPerContainer is the most open connections of the processes
	// of one served container: each container's own share, apart from
	// MaxConns, so no one else can use it up.
	MaxConnsPerContainer int
	// MaxPendingPerUID and MaxPendingPerCgroup bound the connections of
	// peers in no served container that have not completed HELLO, per
	// user and per cgroup.
	MaxPendingPerUID, MaxPendingPerCgroup int
	// MaxConnsPerProcess is the most open connections of one peer process.
	MaxConnsPerProcess int
	// HelloTimeout is how long a connection may take to complete HELLO.
	HelloTimeout time.Duration
	// FrameTimeout is how long the rest of a frame may take once its first
	// byte arrived; between frames a connection may idle.
	FrameTimeout time.Duration
	// AcceptRate and AcceptBurst pace the accepts of one peer: on a
	// container's own socket that socket's, on the shared socket each
	// user's and each cgroup's (pace.go); SharedAcceptRate paces the shared
	// socket's, in bursts of MaxConns.
	AcceptRate, AcceptBurst, SharedAcceptRate int
	// PlacementRate paces the agent's placements for one container, over
	// all its processes (bursts of as many): each ACQUIRE that has the
	// agent move a thread into a slot, each RELEASE that moves it out.
	// 0: not paced.
	PlacementRate int
	// HostNamespaceFDs passes placement fds on cgroup v1 also to peers in
	// the agent's own PID namespace. Off by default: there a v1 fd moves
	// any process of the node; only for standalone runtimes you trust.
	HostNamespaceFDs bool
}

// DefaultLimits hold 250 pods with a few connections per process each.
var DefaultLimits = Limits{MaxConns: 4096, MaxConnsPerContainer: 1024, MaxPendingPerUID: 256, MaxPendingPerCgroup: 256,
	MaxConnsPerProcess: 64, HelloTimeout: 10 * time.Second, FrameTimeout: 10 * time.Second,
	AcceptRate: 100, AcceptBurst: 1024, SharedAcceptRate: 250, PlacementRate: 1000}

// Resolver finds the pool that serves a peer, or a typed error
// (NOT_SERVED, NOT_READY).
type Resolver interface {
	// Resolve may take the peer's container from p.Cgroup, its cgroup at
	// accept, where that names a container that was served before the
	// accept; anything else needs the peer's cgroup now.
	Resolve(p Peer) (*pool.Pool, error)
	// Holds reports whether the peer is still a process of the container
	// pl serves, without preparing anything.
	Holds(p Peer, pl *pool.Pool) bool
	// Processes lists the processes of the container pl serves, in its
	// cgroup and below (cgroup v1: what a placement fd could be handed to).
	Processes(pl *pool.Pool) ([]int, error)
	// Serving names the served container that holds cgroup cg ("": none),
	// without preparing anything: a connection is charged to it at accept.
	Serving(cg string) string
}

// NotServed is a Resolver's refusal of a peer that is not a process of a
// container this agent serves (wire.go: NOT_SERVED).
type NotServed struct{ Reason string }

func (e *NotServed) Error() string { return e.Reason }

// NotReady is a Resolver's answer for a peer whose container cannot be
// served yet: it may say HELLO again after RetryAfter (wire.go: NOT_READY).
type NotReady struct {
	Reason     string
	RetryAfter time.Duration
}

func (e *NotReady) Error() string { return e.Reason }

// Server accepts slot-protocol connections.
type Server struct {
	resolve   Resolver
	hierarchy *cgroup.Hierarchy
	metrics   *metrics.Metrics
	log       *slog.Logger
	limits    Limits
	// self is the agent's own process; ns its PID namespace.
	self   int
	selfNS uint64
	guard  *selfGuard
	// watchExits has each client process's session watch for its exit
	// (tests turn it off to reach the per-request check alone).
	watchExits bool

	mu      sync.Mutex
	conns   map[*conn]struct{}
	charges charges
	// confinedCache holds the last v1 fd rule check per pool.
	confinedCache map[*pool.Pool]confineResult
	sessions      map[processKey]*session
	paces         map[*pool.Pool]*containerPace
	closing       bool
	serving       sync.WaitGroup
	ctx           context.Context
	cancel        context.CancelFunc

	// loops are the accept loops serving now, under a lock of their own:
	// /healthz reads them while mu may be the lock that stalls them.
	loopsMu sync.Mutex
	loops   map[*health.Loop]struct{}
}

// New makes a server.
func New(r Resolver, h *cgroup.Hierarchy, m *metrics.Metrics, log *slog.Logger) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{resolve: r, hierarchy: h, metrics: m, log: log, limits: DefaultLimits, self: os.Getpid(), watchExits: true,
		conns: map[*conn]struct{}{}, charges: newCharges(), confinedCache: map[*pool.Pool]confineResult{}, sessions: map[processKey]*session{}, paces: map[*pool.Pool]*containerPace{}, ctx: ctx, cancel: cancel,
		loops: map[*health.Loop]struct{}{}}
	if ns, err := proc.PIDNamespace(s.self); err == nil {
		s.selfNS = ns
	}
	s.guard = newSelfGuard(h, m, log)
	return s
}

// SetLimits replaces the default limits; call before serving.
func (s *Server) SetLimits(l Limits) { s.limits = l }
