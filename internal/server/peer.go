package server

import (
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/internal/proc"
)

// Peer identity: who is at the other end of a connection, and whether it
// is still that process.

// Peer is what the agent knows of a connecting process.
type Peer struct {
	PID, UID int
	// NS is the inode of the peer's PID namespace.
	NS uint64
	// Cgroup is the peer's cgroup in the cpu hierarchy as read at accept
	// ("": not read), at or after Accepted, through its PID. The process
	// identified below was alive after that read, so it was the one read:
	// a connection is identified by its peer's cgroup at accept, read once.
	Cgroup   string
	Accepted time.Time
}

// identify reads the peer's credentials and PID namespace and takes a
// pidfd of the peer: SO_PEERPIDFD names the process that connected even
// if it has exited since. Without it (Linux < 6.5) the PID is opened and
// its start time re-checked at every use.
func (c *conn) identify() error {
	if testHookBeforeIdentify != nil {
		testHookBeforeIdentify()
	}
	cred, pidfd, perr, err := peerCreds(c.c)
	if err != nil {
		return err
	}
	c.peer.PID, c.peer.UID = int(cred.Pid), int(cred.Uid)
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
	// Without SO_PEERPIDFD the PID may have been reused between the accept
	// and the open above: a process started after the accept is not the
	// one that connected (ticks of 1/100 s: one started within the accept's
	// tick is not caught).
	if c.start > c.acceptedTicks {
		return fmt.Errorf("peer process %d has exited: its PID names a process started after the connection was accepted", c.peer.PID)
	}
	// What was read above, and the cgroup read at accept, belong to the
	// peer only if it still lives.
	return c.alive()
}

// peerCreds reads the peer's SO_PEERCRED and SO_PEERPIDFD (pidfd -1:
// none, for the reason perr).
func peerCreds(uc *net.UnixConn) (cred *unix.Ucred, pidfd int, perr error, err error) {
	var cerr error
	pidfd = -1
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, -1, nil, err
	}
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if cerr == nil && !testHookNoPeerPIDFD {
			var v int
			if v, perr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); perr == nil {
				pidfd = v
			}
		}
	}); err != nil {
		return nil, -1, nil, err
	}
	if cerr != nil {
		return nil, -1, nil, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	return cred, pidfd, perr, nil
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

// bootTicks is the time since boot in the clock ticks (1/100 s) of
// /proc/<pid>/stat's start time; the largest value when it cannot be read
// (then no start time is after it).
func bootTicks() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return math.MaxUint64
	}
	return uint64(ts.Nano()) / 1e7
}

// Test hooks: a pause before a connection's peer is identified, and
// peerCreds as on a kernel without SO_PEERPIDFD (Linux < 6.5).
var (
	testHookBeforeIdentify func()
	testHookNoPeerPIDFD    bool
)
