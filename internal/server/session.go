package server

import (
	"context"
	"errors"
	"sync/atomic"

	"golang.org/x/time/rate"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/pool"
)

// Sessions: one a client process, over all its connections.

// session is one client process over its connections: what is paced or
// bounded per process. Its leases are each the connection's that asked
// for it (the pool's owner), and end with that connection. When the
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
	// gone is set once the agent saw the process exit (a watched session
	// only) and shut its connections: no byte can be added to them, and
	// what the process sent before is its last words (lastWords).
	gone atomic.Bool
	// holdList paces the process's HOLD_LIST answers, over all its
	// connections (a refusal takes a turn of its container's pace).
	holdList *turns
}

// containerPace paces, over all of a container's processes, the frames
// that cost the agent a read and an answer but change nothing, and the
// SLEEPs and WAKEs that retune its slots: a tenant that starts more
// processes buys no more of the agent. One per container served (pool),
// while a connection of it is open; Server.mu guards refs.
type containerPace struct {
	refs int
	// sleeps paces the SLEEPs that lend, usage the USAGE reports, frames
	// the frames that owe a turn (conn.owesTurn), placements the agent's
	// moves of the container's threads (conn.owesPlacement).
	sleeps, usage, frames, placements *turns
}

// paceOf takes a reference to pool p's pace, for a connection that named
// it at HELLO; unpace drops it.
func (s *Server) paceOf(p *pool.Pool) *containerPace {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp := s.paces[p]
	if cp == nil {
		cp = &containerPace{sleeps: newTurns(SleepRate, SleepBurst), usage: newTurns(usageRate, usageBurst),
			frames: newTurns(PacedRate, PacedBurst), placements: newTurns(rate.Inf, 0)}
		if n := s.limits.PlacementRate; n > 0 {
			cp.placements = newTurns(rate.Limit(n), n)
		}
		s.paces[p] = cp
	}
	cp.refs++
	return cp
}

// unpace drops a connection's reference to pool p's pace; the caller holds
// Server.mu.
func (s *Server) unpace(p *pool.Pool) {
	if cp := s.paces[p]; cp != nil {
		if cp.refs--; cp.refs <= 0 {
			delete(s.paces, p)
		}
	}
}

// USAGE is one-way, so nothing paces a sender but the agent: past
// usageRate frames a second (bursts of usageBurst) over all of a
// container's processes, a USAGE waits before it is credited, and its
// connection is not read meanwhile, so a flood fills its own socket and
// blocks its sender, not the agent. The reference clients send about one a
// second per process (SPEC.md).
const (
	usageRate  = 100
	usageBurst = 100
)

// HOLD_LIST is answered at most holdListRate times a second per process (bursts of
// holdListBurst; SPEC.md): each answer walks the pool's leases under its lock.
// The reference clients ask once a second.
const (
	holdListRate  = 5
	holdListBurst = 2
	// holdListRetry is the retry_after_ms of a HOLD_LIST refused for its rate.
	holdListRetry = 1000 / holdListRate
)

// A container's SLEEPs lend at most SleepRate times a second (bursts of
// SleepBurst), over all its processes; past that they are refused and the
// lease stays awake. A SLEEP raises the container's degraded leases and
// its WAKE cuts them again, cgroup writes for one frame: without a bound a
// process flapping one lease would have the agent rewrite slots as fast as
// it sends. A WAKE
// needs no bound: only a lease that slept does anything on WAKE.
const (
	SleepRate  = 1000
	SleepBurst = 1000
	// sleepRetry is the retry_after_ms of a SLEEP refused for its rate.
	sleepRetry = max(1, 1000/SleepRate)
)

// A container's frames that change nothing (a request answered with an
// error, a one-way RELEASE of a lease not held: nothing is counted but the
// error), and its SLEEPs and WAKEs, each take a turn from its pace: at most
// PacedRate a second over all its processes (bursts of PacedBurst). Past
// that, the connection is not read until its turn is due, so a flood fills
// its own socket and blocks its sender, answered or not, and what it costs
// the agent is bounded per container however many processes send it. An
// honest runtime sleeps and wakes a lease at most SleepRate times a second
// and is refused rarely.
const (
	PacedRate  = 2 * SleepRate
	PacedBurst = 2 * SleepBurst
)

// processKey tells processes apart even when a PID is reused.
type processKey struct {
	pid       int
	startTime uint64
}

var errTooManyConns = errors.New("too many connections from one process")

// join adds connection c to its process's session, or refuses it when the
// process holds MaxConnsPerProcess connections already. A new session
// watches the process's exit through pidfd (when there is one).
func (s *Server) join(k processKey, c *conn, pidfd int) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[k]
	if ss == nil {
		ss = &session{key: k, conns: map[*conn]struct{}{},
			holdList: newTurns(holdListRate, holdListBurst)}
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

// leave drops connection c from its session, which ends with its last
// connection.
func (s *Server) leave(ss *session, c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(ss.conns, c)
	ss.refs--
	if ss.refs > 0 {
		return
	}
	delete(s.sessions, ss.key)
	ss.cancel()
	if ss.unwatch != nil {
		ss.unwatch()
	}
}

// exited ends the session of a process that has exited: requests waiting
// on its behalf stop, and its connections are shut down, so nobody (a
// process that inherited or was passed a socket) can send on them any
// more; what the process sent before is still read (lastWords), then the
// connections release their leases as they go (as abandoned) although
// another process may still hold the sockets. It runs once, from the
// watch or from the first request that finds the process gone.
func (s *Server) exited(ss *session) {
	ss.cancel()
	if !ss.gone.CompareAndSwap(false, true) {
		return
	}
	s.mu.Lock()
	conns := make([]*conn, 0, len(ss.conns))
	for c := range ss.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	if len(conns) > 0 {
		s.log.Debug("client process exited; shutting its connections", "pid", ss.key.pid, "connections", len(conns))
	}
	for _, c := range conns {
		// Shut, not closed: reads go on to the end of what is queued.
		// The peer's writes fail from now on, and so do the agent's.
		c.c.CloseRead()
		c.c.CloseWrite()
	}
}

// lastWords reports whether frame f, read after c's process exited, is
// still taken: a USAGE or a RELEASE (neither SLEEP nor WAKE) that the process queued before
// the agent saw its exit, so that its last report and its last releases
// are counted. Only a watched session's are: there the exit shuts the
// connections, so nothing can be added after it; without a watch a
// socket's new holder could write at any time, and every request after the
// exit is refused.
func (s *Server) lastWords(ss *session, f slotv1.Frame) bool {
	if ss.unwatch == nil {
		return false
	}
	s.exited(ss) // if the watch has not run yet: nothing more comes in
	switch m := f.Msg.(type) {
	case *slotv1.Usage:
		return true
	case *slotv1.Release:
		return m.Flags&(slotv1.ReleaseSleep|slotv1.ReleaseWake) == 0
	}
	return false
}
