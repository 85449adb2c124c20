package server

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/health"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/pool"
)

// Transport: the accept loop, and each connection's loop from identifying
// its peer to its last frame. What a request does is in handlers.go.

// Serve accepts connections on the shared socket until the listener is
// closed; its accepts are paced per user and per cgroup (pace.go).
func (s *Server) Serve(ln *Listener) error { return s.serve(ln, s.resolve, false) }

// ServeWith accepts connections on ln, a socket of one container, resolving
// peers with r (it accepts that container's processes only); its accepts
// are paced as one peer's.
func (s *Server) ServeWith(ln *Listener, r Resolver) error { return s.serve(ln, r, true) }

func (s *Server) serve(ln *Listener, r Resolver, own bool) error {
	loop := &health.Loop{Name: "accept loop on " + ln.path}
	s.loopsMu.Lock()
	s.loops[loop] = struct{}{}
	s.loopsMu.Unlock()
	defer func() {
		s.loopsMu.Lock()
		delete(s.loops, loop)
		s.loopsMu.Unlock()
	}()
	var backoff acceptBackoff
	pace := newPacing(s.limits, own)
	for {
		pace.wait(s.metrics)
		fd, err := ln.accept()
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
		loop.Begin()
		ok := s.accepted(fd, r, pace)
		loop.End()
		if !ok {
			return nil
		}
	}
}

// Stalled names the accept loops held up with a connection in hand for
// more than limit (health.Checker): no new connection is served there.
func (s *Server) Stalled(now time.Time, limit time.Duration) error {
	s.loopsMu.Lock()
	defer s.loopsMu.Unlock()
	var errs []error
	for l := range s.loops {
		errs = append(errs, l.Stalled(now, limit))
	}
	return errors.Join(errs...)
}

// accepted charges a new connection, fd, to its share (admit.go) and
// serves it, or closes it when its peer's accepts are paced (pace.go), its
// peer hung up before it was taken, having sent nothing (a reconnect
// loop's), or its share is full; false: the server is closing. Only a
// connection to be served becomes a net.UnixConn, in the poller.
func (s *Server) accepted(fd int, r Resolver, pace *pacing) bool {
	ticks, now := bootTicks(), time.Now()
	ch, ok := s.chargeOf(fd, r, pace)
	if !ok || hungUp(fd) {
		unix.Close(fd)
		return true
	}
	c, err := unixConn(fd)
	if err != nil {
		s.metrics.Error(metrics.AcceptFailed)
		return true
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		c.Close()
		return false
	}
	ok, displace := s.charges.admit(&ch, s.limits)
	if !ok {
		s.mu.Unlock()
		s.metrics.Error(metrics.ConnectionLimit)
		c.Close()
		return true
	}
	if displace != "" {
		s.displace(displace)
	}
	cn := &conn{srv: s, resolve: r, c: c, owner: pool.NewOwner(), charge: ch, accepted: now, acceptedTicks: ticks, pidfd: -1, seen: map[uint32]bool{}, hostTIDs: map[uint32]int{},
		peer: Peer{Cgroup: ch.cgroup, Accepted: now}}
	s.conns[cn] = struct{}{}
	s.serving.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.serving.Done()
		cn.serve()
	}()
	return true
}

// displace closes the connection of cgroup cg that has waited longest for
// its HELLO on the node's share, dropping its counts at once; s.mu is held.
func (s *Server) displace(cg string) {
	var oldest *conn
	for c := range s.conns {
		if ch := &c.charge; ch.pending && ch.container == "" && ch.cgroup == cg && (oldest == nil || c.accepted.Before(oldest.accepted)) {
			oldest = c
		}
	}
	if oldest == nil {
		return
	}
	s.charges.drop(&oldest.charge)
	oldest.charge.displaced = true
	oldest.c.Close()
	s.metrics.Error(metrics.ConnectionLimit)
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

type conn struct {
	srv     *Server
	resolve Resolver
	c       *net.UnixConn
	// charge is what the connection counts against (admit.go), since
	// accepted.
	charge   charge
	accepted time.Time
	// acceptedTicks is bootTicks at the accept: the peer started before.
	acceptedTicks uint64
	peer          Peer
	// pidfd refers to the peer process (-1: the kernel has no pidfds;
	// start then re-checks the PID).
	pidfd   int
	start   uint64
	session *session
	pool    *pool.Pool
	// pace is pool's, set with it at HELLO.
	pace *containerPace
	// owesTurn: the last frame taken owes the container's pace a turn
	// (PacedRate), taken before the next frame is read.
	owesTurn atomic.Bool
	// owesPlacement counts the threads the agent moved for the frames taken
	// since the last turns (an ACQUIRE beside the reader adds its own when
	// it ends); as many turns of the container's placement pace
	// (Limits.PlacementRate) are taken before the next frame.
	owesPlacement atomic.Int32
	// owner is the connection's leases' owner in its pool.
	owner pool.Owner
	fds   bool // the client takes fds
	// confine: the connection got fds by the v1 rule (passesFDs), which
	// is checked again; confinedAt is when it last was (unix ns), and
	// rechecking is set while a check runs.
	confine    bool
	confinedAt atomic.Int64
	rechecking atomic.Bool
	// fdPool is the pool whose fds the connection may hold (RevokeFDs).
	fdPool atomic.Pointer[pool.Pool]
	// local: the client was granted LOCAL (HOLD leases, USAGE reports).
	local bool
	// ctx ends when the process exits or the connection closes: an
	// ACQUIRE waiting on it stops.
	ctx    context.Context
	cancel context.CancelFunc
	// acquiring is set while an ACQUIRE is handled beside the reader
	// (startAcquire); it carries handle's result.
	acquiring chan bool
	// sendMu orders the answers of an ACQUIRE and of the reader.
	sendMu sync.Mutex
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
	c.srv.metrics.Connections(1)
	defer c.finish()
	if err := c.open(); err != nil {
		if errors.Is(err, errTooManyConns) {
			c.srv.metrics.Error(metrics.ConnectionLimit)
			c.srv.log.Debug("connection refused", "pid", c.peer.PID, "err", err)
		} else {
			c.srv.log.Warn("cannot identify peer", "err", err)
		}
		return
	}
	c.buf = make([]byte, 0, 512)
	c.ctx, c.cancel = context.WithCancel(c.session.ctx)
	// HELLO must come soon; after it a connection may idle between frames.
	c.c.SetReadDeadline(time.Now().Add(c.srv.limits.HelloTimeout))
	for {
		if !c.takeTurns() {
			return
		}
		body, err := c.readFrame()
		if err != nil {
			if c.session.gone.Load() {
				return // the end of what an exited process sent (perhaps cut inside a frame)
			}
			var pe *slotv1.Error
			if errors.As(err, &pe) {
				c.srv.metrics.Error(metrics.BadFrame)
				c.srv.log.Warn("bad frame; closing connection", "pid", c.peer.PID, "err", err)
				c.send(0, pe, nil)
			}
			return
		}
		f, err := slotv1.DecodeBody(body)
		if err != nil {
			if !c.undecodable(body, err) {
				return
			}
			continue
		}
		if c.acquiring != nil && !oneWay(f.Msg) {
			// Answers go in order: the ACQUIRE's first.
			if !c.settle() {
				return
			}
		}
		if _, ok := f.Msg.(*slotv1.Acquire); ok && c.pool != nil {
			c.startAcquire(f)
			continue
		}
		if !c.handle(f) {
			return
		}
	}
}

// startAcquire handles an ACQUIRE, which may wait for budget or a slot,
// while the connection is read on: the one-way frames of the leases this
// connection holds (a RELEASE or SLEEP that frees what the ACQUIRE waits
// for) are taken meanwhile, not queued behind it (SPEC.md, "Transport").
// A request that needs an answer waits for it (settle).
func (c *conn) startAcquire(f slotv1.Frame) {
	done := make(chan bool, 1)
	c.acquiring = done
	go func() {
		ok := c.handle(f)
		if !ok {
			c.c.CloseRead() // the reader stops and settles
		}
		done <- ok
	}()
}

// settle waits for the ACQUIRE in flight, if any, and reports whether the
// connection stays open. When the reader stops, the ACQUIRE stops waiting.
func (c *conn) settle() bool {
	if c.acquiring == nil {
		return true
	}
	ok := <-c.acquiring
	c.acquiring = nil
	return ok
}

// oneWay reports whether m is answered with nothing when it is taken.
func oneWay(m slotv1.Message) bool {
	switch m := m.(type) {
	case *slotv1.Release:
		return m.Flags&slotv1.ReleaseNoReply != 0
	case *slotv1.Usage:
		return true
	}
	return false
}

// open identifies the peer and joins its process's session.
func (c *conn) open() error {
	if err := c.identify(); err != nil {
		return err
	}
	if c.session = c.srv.join(processKey{pid: c.peer.PID, startTime: c.start}, c, c.pidfd); c.session == nil {
		return errTooManyConns
	}
	return nil
}

// undecodable answers a frame that does not decode; false closes the
// connection.
func (c *conn) undecodable(body []byte, err error) bool {
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
	c.srv.log.Log(context.Background(), level, "bad request", "pid", c.peer.PID, "err", err, "count", c.badRequests)
	return c.send(binary.BigEndian.Uint32(body[2:6]), pe, nil) && pe.Code != slotv1.CodeUnsupportedVersion && !oneWay
}

// finish ends a connection: its leases go with it (a lease is the
// connection's that asked for it, SPEC.md "Lifetimes"), and its counts are
// dropped.
func (c *conn) finish() {
	c.srv.metrics.Connections(-1)
	if c.cancel != nil {
		c.cancel()
		c.settle() // a lease it grants now is released below
	}
	c.c.Close()
	if c.pidfd >= 0 {
		unix.Close(c.pidfd)
	}
	if c.session != nil {
		c.srv.leave(c.session, c)
	}
	if c.pool != nil {
		if n := c.pool.ReleaseOwner(c.owner); n > 0 {
			c.srv.log.Info("client connection went away holding leases; released", "container", c.pool.Name(), "pid", c.peer.PID, "leases", n)
		}
	}
	c.srv.mu.Lock()
	delete(c.srv.conns, c)
	c.srv.charges.drop(&c.charge)
	if c.pace != nil {
		c.srv.unpace(c.pool)
	}
	c.srv.mu.Unlock()
}
