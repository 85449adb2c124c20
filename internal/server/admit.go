package server

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/internal/metrics"
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
// A connection on the node's share moves to its container's share once
// its HELLO names one (a container served at that HELLO, serveUnder), so
// the node's share holds connections waiting for HELLO (HelloTimeout):
// none that a served container keeps. When it is full, a newcomer takes
// the place of a waiting connection of the cgroup that holds the most, if
// that is more than the newcomer's cgroup would: no set of cgroups can pin
// it for another.
//
// The peer's user and cgroup are read from SO_PEERCRED and its
// /proc/<pid>/cgroup: one getsockopt and one small read per accept, each
// after its bucket of accepts on the shared socket (pace.go).

// charge is what one connection counts against.
type charge struct {
	// container is the served container it is charged to ("": the node).
	container string
	uid       int
	cgroup    string
	// pending: counted in the per-UID and per-cgroup HELLO caps.
	pending bool
	// displaced: its counts were dropped when a newcomer took its place.
	displaced bool
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

// chargeOf reads who is at the other end of a new connection, taking an
// accept from its user's bucket (root has none) before its cgroup is read
// and from its cgroup's after (pace.go); false: one was empty, and the
// connection is to be closed. A peer whose credentials or cgroup cannot be
// read is charged to the node, as user -1 and cgroup "".
func (s *Server) chargeOf(fd int, r Resolver, pace *pacing) (charge, bool) {
	ch := charge{uid: -1}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		cred = nil
	} else {
		ch.uid = int(cred.Uid)
	}
	// Root is every container's that has no user namespace: a bucket of
	// root's would let one of them close the others' connections, so
	// root's peers go to their cgroup's bucket alone (pace.go).
	if pace.users != nil && ch.uid != 0 && !pace.users.allow(ch.uid, time.Now()) {
		s.metrics.Error(metrics.AcceptPacedUser)
		return ch, false
	}
	if cred == nil {
		return ch, true
	}
	if cg, err := s.hierarchy.PathOfPID(int(cred.Pid)); err == nil {
		ch.cgroup = cg
	}
	if pace.cgroups != nil && !pace.cgroups.allow(ch.cgroup, time.Now()) {
		s.metrics.Error(metrics.AcceptPacedCgroup)
		return ch, false
	}
	if ch.cgroup != "" {
		ch.container = r.Serving(ch.cgroup)
	}
	return ch, true
}

// admit counts a new connection against its share, or reports that the
// share is full. When the node's share is full, displace names the cgroup
// one of whose waiting connections the newcomer takes the place of: the
// caller drops that one (displaced).
func (cs *charges) admit(ch *charge, l Limits) (ok bool, displace string) {
	if ch.container != "" {
		if cs.perContainer[ch.container] >= l.MaxConnsPerContainer {
			return false, ""
		}
		cs.perContainer[ch.container]++
		return true, ""
	}
	if cs.pendingUID[ch.uid] >= l.MaxPendingPerUID || cs.pendingCgroup[ch.cgroup] >= l.MaxPendingPerCgroup {
		return false, ""
	}
	if cs.node >= l.MaxConns {
		top, most := "", 0
		for cg, n := range cs.pendingCgroup {
			if n > most {
				top, most = cg, n
			}
		}
		if most <= cs.pendingCgroup[ch.cgroup]+1 {
			return false, "" // the newcomer's cgroup would hold as many: no fairer
		}
		displace = top
	}
	cs.node++
	cs.pendingUID[ch.uid]++
	cs.pendingCgroup[ch.cgroup]++
	ch.pending = true
	return true, displace
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

// named moves a connection whose HELLO named container ctr from the node's
// share to ctr's, and ends its count in the HELLO caps; false: ctr's share
// is full (or the connection was displaced), and the connection closes.
func (cs *charges) named(ch *charge, ctr string, l Limits) bool {
	if ch.displaced {
		return false
	}
	if ch.container == "" && ctr != "" {
		if cs.perContainer[ctr] >= l.MaxConnsPerContainer {
			return false
		}
		cs.node--
		ch.container = ctr
		cs.perContainer[ctr]++
	}
	cs.identified(ch)
	return true
}

// drop ends a closed connection's counts.
func (cs *charges) drop(ch *charge) {
	if ch.displaced {
		return
	}
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
