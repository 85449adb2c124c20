// Package server speaks the slot protocol (api/slot/v1) on a Unix socket.
// Each connection is bound at HELLO to the container of the peer process,
// identified by SO_PEERCRED and that process's cgroup, so a client only ever
// gets slots of its own container.
package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/pool"
	"github.com/cpuslot/cpuslot/internal/proc"
)

// Peer is what the agent knows of a connecting process.
type Peer struct {
	PID, UID int
	// NS is the inode of the peer's PID namespace.
	NS uint64
}

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
	// HostNamespaceFDs passes placement fds on cgroup v1 also to peers in
	// the agent's own PID namespace. Off by default: there a v1 fd moves
	// any process of the node; only for standalone runtimes you trust.
	HostNamespaceFDs bool
}

// DefaultLimits hold 250 pods with a few connections per process each.
var DefaultLimits = Limits{MaxConns: 4096, MaxConnsPerContainer: 1024, MaxPendingPerUID: 256, MaxPendingPerCgroup: 256,
	MaxConnsPerProcess: 64, HelloTimeout: 10 * time.Second, FrameTimeout: 10 * time.Second}

// Resolver finds the pool that serves a peer, or a typed error
// (NOT_SERVED, NOT_READY).
type Resolver interface {
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
	closing       bool
	serving       sync.WaitGroup
	ctx           context.Context
	cancel        context.CancelFunc
}

// New makes a server.
func New(r Resolver, h *cgroup.Hierarchy, m *metrics.Metrics, log *slog.Logger) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{resolve: r, hierarchy: h, metrics: m, log: log, limits: DefaultLimits, self: os.Getpid(), watchExits: true,
		conns: map[*conn]struct{}{}, charges: newCharges(), confinedCache: map[*pool.Pool]confineResult{}, sessions: map[processKey]*session{}, ctx: ctx, cancel: cancel}
	if ns, err := proc.PIDNamespace(s.self); err == nil {
		s.selfNS = ns
	}
	s.guard = newSelfGuard(h, m, log)
	return s
}

// SetLimits replaces the default limits; call before serving.
func (s *Server) SetLimits(l Limits) { s.limits = l }

// Serve accepts connections until the listener is closed.
func (s *Server) Serve(ln *Listener) error { return s.ServeWith(ln, s.resolve) }

// ServeWith accepts connections on ln, resolving peers with r (a socket of
// one container accepts that container's processes only).
func (s *Server) ServeWith(ln *Listener, r Resolver) error {
	var backoff acceptBackoff
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of fds or memory: wait, more each time, and say so
			// rarely; the pending connection stays queued meanwhile.
			s.metrics.Error(metrics.AcceptFailed)
			d, report, n := backoff.failed(time.Now())
			if report {
				s.log.Warn("accept failing; backing off", "err", err, "failures", n, "wait", d)
			}
			time.Sleep(d)
			continue
		}
		backoff.reset()
		ch := s.chargeOf(c, r)
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		if !s.charges.admit(&ch, s.limits) {
			s.mu.Unlock()
			s.metrics.Error(metrics.ConnectionLimit)
			c.Close()
			continue
		}
		cn := &conn{srv: s, resolve: r, c: c, charge: ch, pidfd: -1, seen: map[uint32]bool{}, hostTIDs: map[uint32]int{}}
		s.conns[cn] = struct{}{}
		s.serving.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.serving.Done()
			cn.serve()
		}()
	}
}

// Shutdown closes every connection (clients reconnect to the next agent)
// and waits for their handlers. Leases end with the connections; slots and
// running invocations are left alone.
func (s *Server) Shutdown() {
	s.mu.Lock()
	s.closing = true
	for c := range s.conns {
		c.c.Close()
	}
	s.mu.Unlock()
	s.cancel()
	s.serving.Wait()
}

// session is one client process: it owns the leases taken on any of its
// connections, and loses them when its last connection closes. When the
// process exits, its connections are closed even if another process
// (a child that inherited them, or one they were passed to) keeps them
// open, so its leases end with it.
type session struct {
	key  processKey
	refs int
	// conns are the session's open connections (under Server.mu).
	conns map[*conn]struct{}
	// ctx ends when the process exits or the session ends: a request
	// waiting for a slot on its behalf stops waiting.
	ctx    context.Context
	cancel context.CancelFunc
	// unwatch stops watching the process's exit (nil: not watched).
	unwatch func()
	// usage paces the process's USAGE reports, over all its connections.
	usage *rate.Limiter
	// held paces its HELD requests.
	held *rate.Limiter
}

// USAGE is one-way, so nothing paces a sender but the agent: past
// usageRate frames a second (bursts of usageBurst) a process's USAGE waits
// before it is credited, and its connection is not read meanwhile, so a
// flood fills its own socket and blocks its sender, not the agent. The
// reference clients send about one a second (SPEC.md).
const (
	usageRate  = 100
	usageBurst = 100
)

// HELD is answered at most heldRate times a second per process (bursts of
// heldBurst; SPEC.md): each answer walks the pool's leases under its lock.
// The reference clients ask once a second.
const (
	heldRate  = 5
	heldBurst = 2
	// heldRetry is the retry_after_ms of a HELD refused for its rate.
	heldRetry = 1000 / heldRate
)

// processKey tells processes apart even when a PID is reused.
type processKey struct {
	pid       int
	startTime uint64
}

// join adds connection c to its process's session, or refuses it when the
// process holds MaxConnsPerProcess connections already. A new session
// watches the process's exit through pidfd (when there is one).
func (s *Server) join(k processKey, c *conn, pidfd int) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[k]
	if ss == nil {
		ss = &session{key: k, conns: map[*conn]struct{}{},
			usage: rate.NewLimiter(usageRate, usageBurst), held: rate.NewLimiter(heldRate, heldBurst)}
		ss.ctx, ss.cancel = context.WithCancel(s.ctx)
		if pidfd >= 0 && s.watchExits {
			var err error
			if ss.unwatch, err = watchExit(pidfd, func() { s.exited(ss) }); err != nil {
				// Requests still check the process at every use.
				s.log.Warn("cannot watch a client process's exit", "pid", k.pid, "err", err)
			}
		}
		s.sessions[k] = ss
	}
	if ss.refs >= s.limits.MaxConnsPerProcess {
		return nil
	}
	ss.refs++
	ss.conns[c] = struct{}{}
	return ss
}

// leave drops connection c from its session and reports whether it was
// the last one.
func (s *Server) leave(ss *session, c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(ss.conns, c)
	ss.refs--
	if ss.refs > 0 {
		return false
	}
	delete(s.sessions, ss.key)
	ss.cancel()
	if ss.unwatch != nil {
		ss.unwatch()
	}
	return true
}

// exited ends the session of a process that has exited: requests waiting
// on its behalf stop, and its connections are closed, so the last one to
// go releases its leases (as abandoned) although another process may
// still hold the sockets.
func (s *Server) exited(ss *session) {
	ss.cancel()
	s.mu.Lock()
	conns := make([]*conn, 0, len(ss.conns))
	for c := range ss.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	if len(conns) > 0 {
		s.log.Debug("client process exited; closing its connections", "pid", ss.key.pid, "connections", len(conns))
	}
	for _, c := range conns {
		c.c.Close()
	}
}

type conn struct {
	srv     *Server
	resolve Resolver
	c       *net.UnixConn
	// charge is what the connection counts against (admit.go).
	charge charge
	peer   Peer
	// pidfd refers to the peer process (-1: the kernel has no pidfds;
	// start then re-checks the PID).
	pidfd   int
	start   uint64
	session *session
	pool    *pool.Pool
	fds     bool // the client takes fds
	// confine: the connection got fds by the v1 rule (passesFDs), which
	// is checked again; confinedAt is when it last was (unix ns), and
	// rechecking is set while a check runs.
	confine    bool
	confinedAt atomic.Int64
	rechecking atomic.Bool
	// local: the client was granted LOCAL (HOLD leases, USAGE reports).
	local bool
	// seen holds the slots whose fds this connection was sent.
	seen map[uint32]bool
	// hostTIDs caches the translation of the peer's TIDs into the agent's
	// PID namespace (only needed when the agent places threads).
	hostTIDs map[uint32]int
	buf      []byte
	out      []byte
	// writeDeadline is the deadline set on writes.
	writeDeadline time.Time
	// badRequests counts this connection's bad requests; only the first
	// is logged above debug level (a peer can send millions).
	badRequests int
}

func (c *conn) serve() {
	log := c.srv.log
	c.srv.metrics.Connections(1)
	defer func() {
		c.srv.metrics.Connections(-1)
		c.c.Close()
		if c.pidfd >= 0 {
			unix.Close(c.pidfd)
		}
		if c.session != nil && c.srv.leave(c.session, c) && c.pool != nil {
			if n := c.pool.ReleaseOwner(c.session); n > 0 {
				log.Info("client process went away holding leases; released", "container", c.pool.Name(), "pid", c.peer.PID, "leases", n)
			}
		}
		c.srv.mu.Lock()
		delete(c.srv.conns, c)
		c.srv.charges.drop(&c.charge)
		c.srv.mu.Unlock()
	}()
	if err := c.identify(); err != nil {
		if errors.Is(err, errTooManyConns) {
			c.srv.metrics.Error(metrics.ConnectionLimit)
			log.Debug("connection refused", "pid", c.peer.PID, "err", err)
		} else {
			log.Warn("cannot identify peer", "err", err)
		}
		return
	}
	c.buf = make([]byte, 0, 512)
	// HELLO must come soon; after it a connection may idle between frames.
	c.c.SetReadDeadline(time.Now().Add(c.srv.limits.HelloTimeout))
	for {
		body, err := c.readFrame()
		if err != nil {
			var pe *slotv1.Error
			if errors.As(err, &pe) {
				c.srv.metrics.Error(metrics.BadFrame)
				log.Warn("bad frame; closing connection", "pid", c.peer.PID, "err", err)
				c.send(0, pe, nil)
			}
			return
		}
		f, err := slotv1.DecodeBody(body)
		if err != nil {
			// A USAGE is one-way: its sender reads no answer, so after the
			// error the connection is out of step and is closed.
			oneWay := body[1] == slotv1.TypeUsage
			c.srv.metrics.Error(metrics.BadRequest)
			var pe *slotv1.Error
			errors.As(err, &pe)
			c.badRequests++
			level := slog.LevelWarn
			if c.badRequests > 1 {
				level = slog.LevelDebug
			}
			log.Log(context.Background(), level, "bad request", "pid", c.peer.PID, "err", err, "count", c.badRequests)
			if !c.send(binary.BigEndian.Uint32(body[2:6]), pe, nil) || pe.Code == slotv1.CodeUnsupportedVersion || oneWay {
				return
			}
			continue
		}
		if !c.handle(f) {
			return
		}
	}
}

var errTooManyConns = errors.New("too many connections from one process")

// identify reads the peer's credentials and PID namespace and takes a
// pidfd of the peer: SO_PEERPIDFD names the process that connected even
// if it has exited since. Without it (Linux < 6.5) the PID is opened and
// its start time re-checked at every use.
func (c *conn) identify() error {
	var cred *unix.Ucred
	var cerr, perr error
	pidfd := -1
	rc, err := c.c.SyscallConn()
	if err != nil {
		return err
	}
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if cerr == nil {
			var v int
			if v, perr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); perr == nil {
				pidfd = v
			}
		}
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	c.peer = Peer{PID: int(cred.Pid), UID: int(cred.Uid)}
	if errors.Is(perr, unix.ESRCH) {
		return fmt.Errorf("peer process %d has exited", c.peer.PID)
	}
	if pidfd < 0 {
		// No SO_PEERPIDFD (Linux < 6.5): open the PID; the start time read
		// below and checked at every use stands in for what was lost.
		if fd, err := unix.PidfdOpen(c.peer.PID, 0); err == nil {
			pidfd = fd
		}
	}
	c.pidfd = pidfd
	if c.peer.NS, err = proc.PIDNamespace(c.peer.PID); err != nil {
		return fmt.Errorf("peer %d: %w", cred.Pid, err)
	}
	if c.start, err = proc.StartTime(c.peer.PID); err != nil {
		return err
	}
	// What was read above belongs to the peer only if it still lives.
	if err := c.alive(); err != nil {
		return err
	}
	if c.session = c.srv.join(processKey{pid: c.peer.PID, startTime: c.start}, c, c.pidfd); c.session == nil {
		return errTooManyConns
	}
	return nil
}

// alive checks that the peer process still exists, so that what was just
// read through its PID (its cgroup, its threads) was read of it and not of
// a process that reused the PID.
func (c *conn) alive() error {
	if c.pidfd >= 0 {
		// A pidfd becomes readable when its process has exited.
		fds := []unix.PollFd{{Fd: int32(c.pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("peer %d: %w", c.peer.PID, err)
		}
		if n > 0 {
			return fmt.Errorf("peer process %d has exited", c.peer.PID)
		}
		return nil
	}
	if st, err := proc.StartTime(c.peer.PID); err != nil || st != c.start {
		return fmt.Errorf("peer process %d has exited", c.peer.PID)
	}
	return nil
}

// readFrame returns the next frame's body. Framing errors are *slotv1.Error.
// Nothing longer than the longest request (the longest HELLO before the
// peer is known) is buffered.
func (c *conn) readFrame() ([]byte, error) {
	if err := c.fill(slotv1.HeaderLen); err != nil {
		return nil, err
	}
	n, err := slotv1.BodyLen(c.buf[:slotv1.HeaderLen])
	if err != nil {
		if errors.Is(err, slotv1.ErrTooLarge) {
			return nil, slotv1.Errorf(slotv1.CodeBadRequest, "%v", err)
		}
		return nil, err
	}
	limit := slotv1.MaxRequestLen
	if c.pool == nil {
		limit = slotv1.MaxHelloLen
	}
	if n > limit {
		return nil, slotv1.Errorf(slotv1.CodeBadRequest, "frame of %d bytes is longer than any request this agent accepts now (%d)", n, limit)
	}
	if err := c.fill(slotv1.HeaderLen + n); err != nil {
		return nil, err
	}
	body := make([]byte, n)
	copy(body, c.buf[slotv1.HeaderLen:slotv1.HeaderLen+n])
	c.buf = c.buf[:copy(c.buf, c.buf[slotv1.HeaderLen+n:])]
	return body, nil
}

// fill reads until at least n bytes are buffered. Once part of a frame is
// in, the rest must come within FrameTimeout (a deadline is set only when
// a frame spans reads: most arrive whole).
func (c *conn) fill(n int) error {
	if cap(c.buf) < n {
		nb := make([]byte, len(c.buf), n)
		copy(nb, c.buf)
		c.buf = nb
	}
	deadline := false
	for len(c.buf) < n {
		if len(c.buf) > 0 && !deadline && c.pool != nil {
			c.c.SetReadDeadline(time.Now().Add(c.srv.limits.FrameTimeout))
			deadline = true
		}
		m, err := c.c.Read(c.buf[len(c.buf):cap(c.buf)])
		c.buf = c.buf[:len(c.buf)+m]
		if err != nil {
			if len(c.buf) > 0 && errors.Is(err, io.EOF) {
				return slotv1.Errorf(slotv1.CodeBadRequest, "connection closed inside a frame")
			}
			return err
		}
	}
	if deadline {
		c.c.SetReadDeadline(time.Time{})
	}
	return nil
}

func (c *conn) send(request uint32, m slotv1.Message, fds []int) bool {
	var err error
	c.out, err = slotv1.Append(c.out[:0], request, m)
	if err != nil {
		c.srv.log.Error("encoding response", "err", err)
		return false
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	// A peer that does not read its answers would block this write for
	// ever once the socket's buffers are full: writes get FrameTimeout.
	// The deadline is pushed out only when half of it is gone, so most
	// sends set none.
	if now := time.Now(); c.writeDeadline.Sub(now) < c.srv.limits.FrameTimeout/2 {
		c.writeDeadline = now.Add(c.srv.limits.FrameTimeout)
		c.c.SetWriteDeadline(c.writeDeadline)
	}
	_, _, err = c.c.WriteMsgUnix(c.out, oob, nil)
	return err == nil
}

func (c *conn) fail(request uint32, err error) bool {
	return c.send(request, wireError(err), nil)
}

// handle answers one request; false closes the connection.
func (c *conn) handle(f slotv1.Frame) bool {
	if c.pool == nil {
		h, ok := f.Msg.(*slotv1.Hello)
		if !ok {
			c.srv.metrics.Error(metrics.NoHello)
			return c.fail(f.Request, slotv1.Errorf(slotv1.CodeBadRequest, "the first request must be HELLO")) && false
		}
		return c.hello(f.Request, h)
	}
	// Every request is the opener's: a connection that outlived its
	// process (a child inherited it, or it was passed on) gets nothing
	// more. The session's watch closes it soon; this closes the gap.
	if err := c.alive(); err != nil {
		c.srv.metrics.Error(metrics.NotServed)
		c.srv.log.Info("request on a connection whose process has exited; closing", "container", c.pool.Name(), "pid", c.peer.PID)
		c.fail(f.Request, slotv1.Errorf(slotv1.CodeNotServed, "%v", err))
		return false
	}
	switch m := f.Msg.(type) {
	case *slotv1.Acquire:
		c.recheckConfined()
		return c.acquire(f.Request, m)
	case *slotv1.Release:
		if m.Flags&(slotv1.ReleaseSleep|slotv1.ReleaseWake) != 0 {
			return c.nap(f.Request, m)
		}
		u, err := c.pool.Release(c.session, m.Lease, ending(m.Outcome))
		if c.pool.MovesOnRelease() && c.peer.PID != c.srv.self {
			c.srv.guard.check() // the agent moved the thread out
		}
		if m.Flags&slotv1.ReleaseNoReply != 0 {
			return true // errors are counted by the pool; nothing is sent
		}
		if err != nil {
			return c.fail(f.Request, err)
		}
		return c.send(f.Request, &slotv1.ReleaseOK{CPUNanos: u.CPUNanos, ThrottledNanos: u.ThrottledNanos,
			Periods: u.Periods, ThrottledPeriods: u.ThrottledPeriods}, nil)
	case *slotv1.Reclaim:
		c.recheckConfined()
		return c.reclaim(f.Request, m)
	case *slotv1.Usage:
		return c.usage(f.Request, m)
	case *slotv1.HeldRequest:
		return c.held(f.Request)
	case *slotv1.Hello:
		return c.fail(f.Request, slotv1.Errorf(slotv1.CodeBadRequest, "HELLO sent twice"))
	}
	c.srv.metrics.Error(metrics.BadRequest)
	return c.fail(f.Request, slotv1.Errorf(slotv1.CodeBadRequest, "unexpected %T from a client", f.Msg))
}

func (c *conn) hello(request uint32, h *slotv1.Hello) bool {
	if h.MinVersion > slotv1.Version || h.MaxVersion < slotv1.Version {
		c.fail(request, slotv1.Errorf(slotv1.CodeUnsupportedVersion, "client speaks %d..%d, agent speaks %d", h.MinVersion, h.MaxVersion, slotv1.Version))
		return false
	}
	p, err := c.resolve.Resolve(c.peer)
	if err == nil {
		err = c.alive()
		if err != nil {
			err = slotv1.Errorf(slotv1.CodeNotServed, "%v", err)
		}
	}
	if err != nil {
		var pe *slotv1.Error
		if errors.As(err, &pe) && pe.Code == slotv1.CodeNotReady {
			return c.fail(request, err) // the client may say HELLO again later
		}
		c.srv.metrics.Error(metrics.NotServed)
		c.srv.log.Warn("refused peer", "pid", c.peer.PID, "uid", c.peer.UID, "err", err)
		c.fail(request, err)
		return false
	}
	c.pool = p
	c.c.SetReadDeadline(time.Time{})
	c.srv.mu.Lock()
	c.srv.charges.identified(&c.charge)
	c.srv.mu.Unlock()
	if h.Flags&slotv1.HelloFDPassing != 0 {
		err := c.passesFDs()
		c.fds = err == nil
		if err != nil {
			c.srv.log.Debug("the agent places this peer's threads", "pid", c.peer.PID, "reason", err)
		}
	}
	sum := p.Summary()
	place, stat := c.srv.hierarchy.SlotFDs()
	ok := &slotv1.HelloOK{Version: slotv1.Version, Hierarchy: uint8(c.srv.hierarchy.Version), PlaceFDs: uint8(place), StatFDs: uint8(stat),
		Container: slotv1.Clean(truncate(sum.Name, slotv1.MaxStringLen)), BudgetMilli: sum.BudgetMilli}
	if c.srv.hierarchy.FavorDynMods {
		ok.Flags |= slotv1.HelloOKFavorDynMods
	}
	if !c.fds {
		ok.Flags |= slotv1.HelloOKAgentPlaces
	}
	// LOCAL needs fds: the client's threads place themselves in the slots
	// the process holds.
	if c.local = h.Flags&slotv1.HelloLocal != 0 && c.fds && p.GrantsHold(); c.local {
		ok.Flags |= slotv1.HelloOKLocal | slotv1.HelloOKHeld
	}
	if p.Lends() {
		ok.Flags |= slotv1.HelloOKLend
	}
	for _, q := range sum.Quotas {
		ok.Pools = append(ok.Pools, slotv1.PoolSummary{QuotaMilli: q.QuotaMilli, PeriodUS: q.PeriodUS, Slots: uint16(min(q.Slots, 0xFFFF)), Free: uint16(min(q.Free, 0xFFFF))})
	}
	c.srv.log.Debug("client connected", "container", sum.Name, "pid", c.peer.PID, "client", h.Client, "fds", c.fds, "local", c.local)
	return c.send(request, ok, nil)
}

// nap takes a RELEASE with SLEEP or WAKE: the lease's invocation sleeps or
// woke up (SPEC.md, "Lending"); the lease is not released.
func (c *conn) nap(request uint32, m *slotv1.Release) bool {
	var err error
	switch {
	case m.Flags&slotv1.ReleaseSleep != 0 && m.Flags&slotv1.ReleaseWake != 0:
		c.srv.metrics.Error(metrics.BadRequest)
		err = slotv1.Errorf(slotv1.CodeBadRequest, "SLEEP and WAKE together")
	case m.Outcome != slotv1.InvocationOK:
		c.srv.metrics.Error(metrics.BadRequest)
		err = slotv1.Errorf(slotv1.CodeBadRequest, "SLEEP or WAKE with outcome %v, want OK", m.Outcome)
	case m.Flags&slotv1.ReleaseSleep != 0:
		err = c.pool.Sleep(c.session, m.Lease)
	default:
		err = c.pool.Wake(c.session, m.Lease)
	}
	if m.Flags&slotv1.ReleaseNoReply != 0 {
		return true // errors are counted; nothing is sent
	}
	if err != nil {
		return c.fail(request, err)
	}
	return c.send(request, &slotv1.ReleaseOK{}, nil)
}

// badRequest answers a request the agent refuses as malformed, and counts
// it; the connection stays open.
func (c *conn) badRequest(request uint32, format string, args ...any) bool {
	c.srv.metrics.Error(metrics.BadRequest)
	return c.fail(request, slotv1.Errorf(slotv1.CodeBadRequest, format, args...))
}

func (c *conn) acquire(request uint32, m *slotv1.Acquire) bool {
	hold := m.Flags&slotv1.AcquireHold != 0
	if hold && !c.local {
		return c.badRequest(request, "HOLD needs a connection granted LOCAL at HELLO")
	}
	req := pool.Request{
		Owner: c.session, QuotaMilli: m.QuotaMilli, Thread: pool.Thread{NS: c.peer.NS, TID: m.TID},
		CurrentSlot: m.CurrentSlot, AgentPlaces: !c.fds || m.Flags&slotv1.AcquireAgentPlaces != 0,
		Wait: time.Duration(m.WaitUS) * time.Microsecond, Action: m.Action, Invocation: m.Invocation,
		Hold: hold,
	}
	req.HostTID = func() (int, error) { return c.hostTID(m.TID) }
	req.NeedFDs = c.needFDs
	g, err := c.pool.Acquire(c.session.ctx, req)
	if errors.Is(err, pool.ErrBadRequest) {
		c.srv.metrics.Error(metrics.BadRequest)
	}
	if !hold && c.peer.PID != c.srv.self && c.pool.AgentPlaces(req.AgentPlaces) {
		c.srv.guard.check() // an agent placement (or eviction) may have run
	}
	if err != nil {
		return c.fail(request, err)
	}
	return c.grant(request, g)
}

// reclaim re-declares a lease after a reconnect: a thread's, or with tid 0
// and no action a HOLD lease (only on a LOCAL connection).
func (c *conn) reclaim(request uint32, m *slotv1.Reclaim) bool {
	var g *pool.Grant
	var err error
	if m.TID == 0 && m.Action == "" {
		if !c.local {
			return c.badRequest(request, "RECLAIM of a HOLD lease (tid 0, no action) needs a connection granted LOCAL at HELLO")
		}
		if m.Invocation != "" {
			return c.badRequest(request, "a HOLD lease has no invocation")
		}
		g, err = c.pool.ReclaimHold(c.session, m.Slot, m.QuotaMilli)
	} else {
		g, err = c.pool.Reclaim(c.session, m.Slot, m.QuotaMilli, pool.Thread{NS: c.peer.NS, TID: m.TID}, m.Action)
	}
	if err != nil {
		return c.fail(request, err)
	}
	return c.grant(request, g)
}

// usage credits a USAGE report. It is one-way: nothing is answered unless
// it is refused, and then the connection is closed (its sender reads no
// answer, so it would be out of step). Its cost is bounded per frame like
// any request's: at most MaxUsageRecords records, each a label lookup.
func (c *conn) usage(request uint32, m *slotv1.Usage) bool {
	if !c.local {
		c.badRequest(request, "USAGE needs a connection granted LOCAL at HELLO")
		return false
	}
	if !c.session.usage.Allow() {
		c.srv.metrics.Error(metrics.UsageThrottled)
		if c.session.usage.Wait(c.session.ctx) != nil {
			return false // the agent is stopping, or the process exited
		}
	}
	rs := make([]pool.Report, len(m.Records))
	for i, r := range m.Records {
		rs[i] = pool.Report{Action: r.Action, How: ending(r.Outcome), N: uint64(r.Invocations), CPUNanos: r.CPUNanos, ThrottledNanos: r.ThrottledNanos}
	}
	c.pool.Reported(c.session, rs)
	return true
}

// held answers HELD: the process's HOLD leases as granted now, and how
// much of them to give back so that the container fits its budget again.
// Its cost is bounded: at most heldRate answers a second per process, each
// listing at most MaxHeldLeases leases.
func (c *conn) held(request uint32) bool {
	if !c.local {
		return c.badRequest(request, "HELD needs a connection granted LOCAL at HELLO")
	}
	if !c.session.held.Allow() {
		c.srv.metrics.Error(metrics.HeldThrottled)
		return c.send(request, &slotv1.Error{Code: slotv1.CodeRejected, RetryAfterMS: heldRetry,
			Message: fmt.Sprintf("HELD at most %d times a second per process", heldRate)}, nil)
	}
	h := c.pool.Held(c.session, slotv1.MaxHeldLeases)
	ok := &slotv1.HeldOK{BudgetMilli: h.BudgetMilli, GiveBackMilli: h.GiveBackMilli, Leases: make([]slotv1.HeldLease, len(h.Leases))}
	for i, l := range h.Leases {
		ok.Leases[i] = slotv1.HeldLease{Lease: l.Lease, Slot: l.SlotID, QuotaMilli: l.QuotaMilli}
		if l.Degraded {
			ok.Leases[i].Flags = slotv1.HeldDegraded
		}
	}
	return c.send(request, ok, nil)
}

// needFDs reports whether this connection takes fds and was not yet sent
// those of slot id.
func (c *conn) needFDs(id uint32) bool { return c.fds && !c.seen[id] }

func (c *conn) grant(request uint32, g *pool.Grant) bool {
	defer g.CloseFDs() // opened for this grant; the client got its copies
	resp := &slotv1.AcquireOK{Lease: g.Lease, Slot: g.SlotID, QuotaMilli: g.Spec.QuotaMilli, PeriodUS: g.Spec.PeriodUS,
		Outcome: outcomes[g.Outcome], Place: places[g.Place]}
	if g.Queued {
		resp.Flags |= slotv1.AcquiredQueued
	}
	if g.Degraded {
		resp.Flags |= slotv1.AcquiredDegraded
	}
	var fds []int
	if len(g.FDs) > 0 {
		fds = g.FDs
		resp.NumFDs = uint8(len(fds))
		c.seen[g.SlotID] = true
	}
	return c.send(request, resp, fds)
}

// passesFDs reports why a peer may not hold placement fds (nil: it may).
// On v2 the kernel lets a placement fd move only threads of the
// container's own threaded subtree. On v1 it checks nothing but the
// opener (the agent), so a holder could move any process it can name: fds
// go only to a peer whose PID namespace holds its whole container
// (confined), and to the agent's own process, which holds them anyway.
// Everyone else has the agent place its threads (docs/security.md).
func (c *conn) passesFDs() error {
	s := c.srv
	if s.hierarchy.ConfinesFDs() || c.peer.PID == s.self || s.limits.HostNamespaceFDs {
		return nil
	}
	if c.peer.NS == s.selfNS {
		return errors.New("the peer is in the agent's PID namespace")
	}
	if err := s.confinedPool(c.peer.NS, c.pool, c.resolve); err != nil {
		return err
	}
	c.confine = true
	c.confinedAt.Store(time.Now().UnixNano())
	return c.alive() // the namespace read at accept is the peer's
}

// recheckConfined checks again, at most every confineRecheck and off the
// request's path, that a v1 connection holding fds still meets passesFDs:
// the container may have gained a process outside the peer's namespace
// (the runtime's exec into a host-namespace container). If not, the
// connection is closed; the client's next HELLO gets AGENT_PLACES.
func (c *conn) recheckConfined() {
	if !c.fds || !c.confine || time.Since(time.Unix(0, c.confinedAt.Load())) < confineRecheck ||
		!c.rechecking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer c.rechecking.Store(false)
		err := c.srv.confinedPool(c.peer.NS, c.pool, c.resolve)
		if err == nil {
			c.confinedAt.Store(time.Now().UnixNano())
			return
		}
		c.srv.metrics.Error(metrics.FDsRevoked)
		c.srv.log.Warn("container no longer confined to the peer's PID namespace; closing its fd connection",
			"container", c.pool.Name(), "pid", c.peer.PID, "err", err)
		c.c.Close()
	}()
}

// confinedPool is confined for the processes of the container pl serves,
// remembered for confineRecheck per pool and namespace, so that the
// connections of one pod share one walk of its cgroups.
func (s *Server) confinedPool(ns uint64, pl *pool.Pool, r Resolver) error {
	now := time.Now()
	s.mu.Lock()
	if e, ok := s.confinedCache[pl]; ok && e.ns == ns && now.Sub(e.at) < confineRecheck {
		s.mu.Unlock()
		return e.err
	}
	s.mu.Unlock()
	procs, err := r.Processes(pl)
	if err == nil {
		err = confined(ns, procs)
	}
	s.mu.Lock()
	for p, e := range s.confinedCache {
		if now.Sub(e.at) >= confineRecheck {
			delete(s.confinedCache, p) // stale, perhaps of a pool that is gone
		}
	}
	s.confinedCache[pl] = confineResult{ns: ns, at: now, err: err}
	s.mu.Unlock()
	return err
}

// hostTID translates a TID of the peer's PID namespace into the agent's,
// checking that the thread belongs to the peer process, which is still the
// process that connected: the agent never moves a thread of another
// process, never TID 0 (the writer itself) and never one of its own.
func (c *conn) hostTID(nsTID uint32) (int, error) {
	if nsTID == 0 {
		return 0, errors.New("thread id 0")
	}
	if c.peer.PID == c.srv.self {
		return 0, errors.New("the agent does not place its own threads")
	}
	host, ok := c.hostTIDs[nsTID]
	if !ok || proc.NSpid(c.peer.PID, host) != nsTID {
		var err error
		if host, err = proc.FindHostTID(c.peer.PID, nsTID); err != nil {
			return 0, err
		}
	}
	if host <= 0 || c.srv.isSelf(host) {
		return 0, fmt.Errorf("thread %d is not the peer's", nsTID)
	}
	// The thread was found under the peer's PID; it is the peer's if the
	// peer still lives, and the peer is still in its container.
	if err := c.alive(); err != nil {
		return 0, err
	}
	if !c.resolve.Holds(c.peer, c.pool) {
		return 0, fmt.Errorf("peer process %d left its container", c.peer.PID)
	}
	c.hostTIDs[nsTID] = host
	return host, nil
}

// isSelf reports whether tid is a thread of the agent's process.
func (s *Server) isSelf(tid int) bool {
	if tid == s.self {
		return true
	}
	return proc.IsThreadOf(s.self, tid)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
