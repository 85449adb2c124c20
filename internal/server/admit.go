package server

import (
	"net"

	"golang.org/x/sys/unix"
)

// Connections are charged at accept, before anyone knows what a peer will
// say, to one of two kinds of share (docs/security.md, "Limits"):
//
//   - a served container's own share (MaxConnsPerContainer), for peers
//     whose cgroup is in a served container: only that container's
//     processes can fill it;
//   - the node's share for everyone else (MaxConns), within which one
//     user (MaxPendingPerUID) and one cgroup (MaxPendingPerCgroup) hold at
//     most so many connections that have not completed HELLO.
//
// The peer's user and cgroup are read from SO_PEERCRED and its
// /proc/<pid>/cgroup: one getsockopt and one small read per accept.

// charge is what one connection counts against.
type charge struct {
	// container is the served container it is charged to ("": the node).
	container string
	uid       int
	cgroup    string
	// pending: counted in the per-UID and per-cgroup HELLO caps.
	pending bool
}

// charges counts the open connections per share; Server.mu guards it.
type charges struct {
	node          int
	perContainer  map[string]int
	pendingUID    map[int]int
	pendingCgroup map[string]int
}

func newCharges() charges {
	return charges{perContainer: map[string]int{}, pendingUID: map[int]int{}, pendingCgroup: map[string]int{}}
}

// chargeOf reads who is at the other end of a new connection. A peer whose
// credentials or cgroup cannot be read is charged to the node.
func (s *Server) chargeOf(c *net.UnixConn, r Resolver) charge {
	ch := charge{uid: -1}
	rc, err := c.SyscallConn()
	if err != nil {
		return ch
	}
	var cred *unix.Ucred
	cerr := rc.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil || err != nil || cred == nil {
		// a closed socket: Control never ran the read (cred stays nil)
		return ch
	}
	ch.uid = int(cred.Uid)
	if cg, err := s.hierarchy.PathOfPID(int(cred.Pid)); err == nil {
		ch.cgroup = cg
		ch.container = r.Serving(cg)
	}
	return ch
}

// admit counts a new connection against its share, or reports that the
// share is full.
func (cs *charges) admit(ch *charge, l Limits) bool {
	if ch.container != "" {
		if cs.perContainer[ch.container] >= l.MaxConnsPerContainer {
			return false
		}
		cs.perContainer[ch.container]++
		return true
	}
	if cs.node >= l.MaxConns || cs.pendingUID[ch.uid] >= l.MaxPendingPerUID || cs.pendingCgroup[ch.cgroup] >= l.MaxPendingPerCgroup {
		return false
	}
	cs.node++
	cs.pendingUID[ch.uid]++
	cs.pendingCgroup[ch.cgroup]++
	ch.pending = true
	return true
}

// identified ends a connection's count in the HELLO caps once its HELLO
// was answered; it stays in its share until it closes.
func (cs *charges) identified(ch *charge) {
	if !ch.pending {
		return
	}
	ch.pending = false
	decr(cs.pendingUID, ch.uid)
	decr(cs.pendingCgroup, ch.cgroup)
}

// drop ends a closed connection's counts.
func (cs *charges) drop(ch *charge) {
	cs.identified(ch)
	if ch.container != "" {
		decr(cs.perContainer, ch.container)
	} else {
		cs.node--
	}
}

func decr[K comparable](m map[K]int, k K) {
	if m[k] <= 1 {
		delete(m, k)
	} else {
		m[k]--
	}
}
