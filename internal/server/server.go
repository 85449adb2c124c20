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
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/pool"
)

// Peer is what the agent knows of a connecting process.
type Peer struct {
	PID, UID int
	// NS is the inode of the peer's PID namespace.
	NS uint64
}

// Resolver finds the pool that serves a peer, or a typed error
// (NOT_SERVED, NOT_READY).
type Resolver interface {
	Resolve(p Peer) (*pool.Pool, error)
}

// Server accepts slot-protocol connections.
type Server struct {
	resolve   Resolver
	hierarchy *cgroup.Hierarchy
	metrics   *metrics.Metrics
	log       *slog.Logger

	mu       sync.Mutex
	conns    map[*conn]struct{}
	sessions map[processKey]*session
	closing  bool
	serving  sync.WaitGroup
	ctx      context.Context
	cancel   context.CancelFunc
}

// New makes a server.
func New(r Resolver, h *cgroup.Hierarchy, m *metrics.Metrics, log *slog.Logger) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{resolve: r, hierarchy: h, metrics: m, log: log, conns: map[*conn]struct{}{}, sessions: map[processKey]*session{}, ctx: ctx, cancel: cancel}
}

// Listener is a Unix socket listener that removes its file when closed.
type Listener struct {
	*net.UnixListener
	path string
}

// Close stops listening and removes the socket file.
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) && err == nil {
		err = rerr
	}
	return err
}

// maxSunPath is the room for a socket path in sockaddr_un, NUL included.
const maxSunPath = 108

// Listen opens a Unix socket at path, replacing a stale one, readable and
// writable by everyone (access is decided per peer, not by file mode). A
// path too long for sockaddr_un (a pod's emptyDir under the kubelet's
// directory is) is bound through its directory's descriptor.
func Listen(path string) (*Listener, error) {
	dir := dirOf(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	addr := path
	if len(path) >= maxSunPath {
		d, err := os.Open(dir)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		addr = fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), path[len(dir)+1:])
		if len(addr) >= maxSunPath {
			return nil, fmt.Errorf("socket name in %s too long", path)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return nil, err
	}
	// The file is removed by its real path in Close.
	ln.SetUnlinkOnClose(false)
	l := &Listener{UnixListener: ln, path: path}
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i > 0 {
		return p[:i]
	}
	return "."
}

// Serve accepts connections until the listener is closed.
func (s *Server) Serve(ln *Listener) error { return s.ServeWith(ln, s.resolve) }

// ServeWith accepts connections on ln, resolving peers with r (a socket of
// one container accepts that container's processes only).
func (s *Server) ServeWith(ln *Listener, r Resolver) error {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.log.Warn("accept failed", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		cn := &conn{srv: s, resolve: r, c: c, seen: map[uint32]bool{}, hostTIDs: map[uint32]int{}}
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
// connections, and loses them when its last connection closes.
type session struct {
	key  processKey
	refs int
}

// processKey tells processes apart even when a PID is reused.
type processKey struct {
	pid       int
	startTime uint64
}

func (s *Server) join(k processKey) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[k]
	if ss == nil {
		ss = &session{key: k}
		s.sessions[k] = ss
	}
	ss.refs++
	return ss
}

// leave drops a connection from its session and reports whether it was the
// last one.
func (s *Server) leave(ss *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss.refs--
	if ss.refs > 0 {
		return false
	}
	delete(s.sessions, ss.key)
	return true
}

type conn struct {
	srv     *Server
	resolve Resolver
	c       *net.UnixConn
	peer    Peer
	session *session
	pool    *pool.Pool
	fds     bool // the client takes fds
	// seen holds the slots whose fds this connection was sent.
	seen map[uint32]bool
	// hostTIDs caches the translation of the peer's TIDs into the agent's
	// PID namespace (only needed when the agent places threads).
	hostTIDs map[uint32]int
	buf      []byte
	out      []byte
}

func (c *conn) serve() {
	log := c.srv.log
	c.srv.metrics.Connections(1)
	defer func() {
		c.srv.metrics.Connections(-1)
		c.c.Close()
		if c.session != nil && c.srv.leave(c.session) && c.pool != nil {
			if n := c.pool.ReleaseOwner(c.session); n > 0 {
				log.Info("client process went away holding leases; released", "container", c.pool.Name(), "pid", c.peer.PID, "leases", n)
			}
		}
		c.srv.mu.Lock()
		delete(c.srv.conns, c)
		c.srv.mu.Unlock()
	}()
	if err := c.identify(); err != nil {
		log.Warn("cannot identify peer", "err", err)
		return
	}
	c.buf = make([]byte, 0, 512)
	for {
		body, err := c.readFrame()
		if err != nil {
			var pe *slotv1.Error
			if errors.As(err, &pe) {
				c.srv.metrics.Error("bad_frame")
				log.Warn("bad frame; closing connection", "pid", c.peer.PID, "err", err)
				c.send(0, pe, nil)
			}
			return
		}
		f, err := slotv1.DecodeBody(body)
		if err != nil {
			c.srv.metrics.Error("bad_request")
			var pe *slotv1.Error
			errors.As(err, &pe)
			log.Warn("bad request", "pid", c.peer.PID, "err", err)
			c.send(binary.BigEndian.Uint32(body[2:6]), pe, nil)
			if pe.Code == slotv1.CodeUnsupportedVersion {
				return
			}
			continue
		}
		if !c.handle(f) {
			return
		}
	}
}

// identify reads the peer's credentials and PID namespace.
func (c *conn) identify() error {
	var cred *unix.Ucred
	var cerr error
	rc, err := c.c.SyscallConn()
	if err != nil {
		return err
	}
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	c.peer = Peer{PID: int(cred.Pid), UID: int(cred.Uid)}
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", cred.Pid), &st); err != nil {
		return fmt.Errorf("peer %d: %w", cred.Pid, err)
	}
	c.peer.NS = st.Ino
	start, err := processStart(c.peer.PID)
	if err != nil {
		return err
	}
	c.session = c.srv.join(processKey{pid: c.peer.PID, startTime: start})
	return nil
}

// readFrame returns the next frame's body. Framing errors are *slotv1.Error.
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
	if err := c.fill(slotv1.HeaderLen + n); err != nil {
		return nil, err
	}
	body := make([]byte, n)
	copy(body, c.buf[slotv1.HeaderLen:slotv1.HeaderLen+n])
	c.buf = c.buf[:copy(c.buf, c.buf[slotv1.HeaderLen+n:])]
	return body, nil
}

// fill reads until at least n bytes are buffered.
func (c *conn) fill(n int) error {
	if cap(c.buf) < n {
		nb := make([]byte, len(c.buf), n)
		copy(nb, c.buf)
		c.buf = nb
	}
	for len(c.buf) < n {
		m, err := c.c.Read(c.buf[len(c.buf):cap(c.buf)])
		c.buf = c.buf[:len(c.buf)+m]
		if err != nil {
			if len(c.buf) > 0 && errors.Is(err, io.EOF) {
				return slotv1.Errorf(slotv1.CodeBadRequest, "connection closed inside a frame")
			}
			return err
		}
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
	_, _, err = c.c.WriteMsgUnix(c.out, oob, nil)
	return err == nil
}

func (c *conn) fail(request uint32, err error) bool {
	var pe *slotv1.Error
	if !errors.As(err, &pe) {
		pe = slotv1.Errorf(slotv1.CodeInternal, "%v", err)
	}
	return c.send(request, pe, nil)
}

// handle answers one request; false closes the connection.
func (c *conn) handle(f slotv1.Frame) bool {
	if c.pool == nil {
		h, ok := f.Msg.(*slotv1.Hello)
		if !ok {
			c.srv.metrics.Error("no_hello")
			return c.fail(f.Request, slotv1.Errorf(slotv1.CodeBadRequest, "the first request must be HELLO")) && false
		}
		return c.hello(f.Request, h)
	}
	switch m := f.Msg.(type) {
	case *slotv1.Acquire:
		return c.acquire(f.Request, m)
	case *slotv1.Release:
		u, err := c.pool.Release(c.session, m.Lease, m.Outcome.String())
		if m.Flags&slotv1.ReleaseNoReply != 0 {
			return true // errors are counted by the pool; nothing is sent
		}
		if err != nil {
			return c.fail(f.Request, err)
		}
		return c.send(f.Request, &slotv1.ReleaseOK{CPUNanos: u.CPUNanos, ThrottledNanos: u.ThrottledNanos,
			Periods: u.Periods, ThrottledPeriods: u.ThrottledPeriods}, nil)
	case *slotv1.Reclaim:
		g, err := c.pool.Reclaim(c.session, m.Slot, m.QuotaMilli, pool.Thread{NS: c.peer.NS, TID: m.TID}, m.Action)
		if err != nil {
			return c.fail(f.Request, err)
		}
		return c.grant(f.Request, g)
	case *slotv1.Hello:
		return c.fail(f.Request, slotv1.Errorf(slotv1.CodeBadRequest, "HELLO sent twice"))
	}
	c.srv.metrics.Error("bad_request")
	return c.fail(f.Request, slotv1.Errorf(slotv1.CodeBadRequest, "unexpected %T from a client", f.Msg))
}

func (c *conn) hello(request uint32, h *slotv1.Hello) bool {
	if h.MinVersion > slotv1.Version || h.MaxVersion < slotv1.Version {
		c.fail(request, slotv1.Errorf(slotv1.CodeUnsupportedVersion, "client speaks %d..%d, agent speaks %d", h.MinVersion, h.MaxVersion, slotv1.Version))
		return false
	}
	p, err := c.resolve.Resolve(c.peer)
	if err != nil {
		var pe *slotv1.Error
		if errors.As(err, &pe) && pe.Code == slotv1.CodeNotReady {
			return c.fail(request, err) // the client may say HELLO again later
		}
		c.srv.metrics.Error("not_served")
		c.srv.log.Warn("refused peer", "pid", c.peer.PID, "uid", c.peer.UID, "err", err)
		c.fail(request, err)
		return false
	}
	c.pool = p
	c.fds = h.Flags&slotv1.HelloFDPassing != 0
	sum := p.Summary()
	place, stat := c.srv.hierarchy.SlotFDs()
	ok := &slotv1.HelloOK{Version: slotv1.Version, Hierarchy: uint8(c.srv.hierarchy.Version), PlaceFDs: uint8(place), StatFDs: uint8(stat),
		Container: sum.Name, BudgetMilli: sum.BudgetMilli}
	if c.srv.hierarchy.FavorDynMods {
		ok.Flags |= slotv1.HelloOKFavorDynMods
	}
	if !c.fds {
		ok.Flags |= slotv1.HelloOKAgentPlaces
	}
	for _, q := range sum.Quotas {
		ok.Pools = append(ok.Pools, slotv1.PoolSummary{QuotaMilli: q.QuotaMilli, PeriodUS: q.PeriodUS, Slots: uint16(min(q.Slots, 0xFFFF)), Free: uint16(min(q.Free, 0xFFFF))})
	}
	c.srv.log.Debug("client connected", "container", sum.Name, "pid", c.peer.PID, "client", h.Client, "fds", c.fds)
	return c.send(request, ok, nil)
}

func (c *conn) acquire(request uint32, m *slotv1.Acquire) bool {
	req := pool.Request{
		Owner: c.session, QuotaMilli: m.QuotaMilli, Thread: pool.Thread{NS: c.peer.NS, TID: m.TID},
		CurrentSlot: m.CurrentSlot, AgentPlaces: !c.fds || m.Flags&slotv1.AcquireAgentPlaces != 0,
		Wait: time.Duration(m.WaitUS) * time.Microsecond, Action: m.Action, Invocation: m.Invocation,
	}
	req.HostTID = func() (int, error) { return c.hostTID(m.TID) }
	req.NeedFDs = c.needFDs
	g, err := c.pool.Acquire(c.srv.ctx, req)
	if err != nil {
		return c.fail(request, err)
	}
	return c.grant(request, g)
}

// needFDs reports whether this connection takes fds and was not yet sent
// those of slot id.
func (c *conn) needFDs(id uint32) bool { return c.fds && !c.seen[id] }

func (c *conn) grant(request uint32, g *pool.Grant) bool {
	defer g.CloseFDs() // opened for this grant; the client got its copies
	resp := &slotv1.AcquireOK{Lease: g.Lease, Slot: g.SlotID, QuotaMilli: g.Spec.QuotaMilli, PeriodUS: g.Spec.PeriodUS,
		Outcome: g.Outcome, Place: g.Place}
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

// hostTID translates a TID of the peer's PID namespace into the agent's,
// checking that the thread belongs to the peer process: the agent never
// moves a thread of another process.
func (c *conn) hostTID(nsTID uint32) (int, error) {
	if host, ok := c.hostTIDs[nsTID]; ok && nspidOf(c.peer.PID, host) == nsTID {
		return host, nil
	}
	host, err := findHostTID(c.peer.PID, nsTID)
	if err != nil {
		return 0, err
	}
	c.hostTIDs[nsTID] = host
	return host, nil
}
