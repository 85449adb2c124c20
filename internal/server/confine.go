package server

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/internal/proc"
)

// On cgroup v1 a placement fd moves any process its holder can name, and
// a holder names processes by their ids in its own PID namespace: what a
// fd reaches is that namespace and those below it. Fds pass from process
// to process, so the agent sends them only to a peer whose PID namespace
// holds its whole container: every process of the container lives in that
// namespace or below it, and the namespace's init (its PID 1) is one of
// the container's processes. A namespace nested inside a container whose
// other processes live outside it fails the first test as long as they do;
// one whose init lives in another container (a pod that shares its process
// namespace) fails the second. docs/security.md gives the argument.

// errNotConfined: the container has a process the peer's fds could reach
// beyond its PID namespace, or that namespace's init lives elsewhere.
var errNotConfined = errors.New("PID namespace does not hold the whole container")

// confineRecheck is how long a check stands: a connection that holds fds
// has its container checked again at its first ACQUIRE or RECLAIM after
// it, and a HELLO within it reuses its pool's last check.
const confineRecheck = time.Second

// confineResult is one check of a pool's container for namespace ns.
type confineResult struct {
	ns  uint64
	at  time.Time
	err error
}

// confined checks that every process in procs (a container's, as the agent
// listed them) lives in PID namespace ns or below it, and that the init of
// ns is one of them. Processes that exit meanwhile are skipped: they hold
// nothing any more.
func confined(ns uint64, procs []int) error {
	init := false
	for _, pid := range procs {
		in, err := proc.InPIDNamespace(pid, ns)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: process %d: %v", errNotConfined, pid, err)
		}
		if !in {
			return fmt.Errorf("%w: process %d lives outside it", errNotConfined, pid)
		}
		if !init && nsInode(pid) == ns && proc.NSpid(pid, pid) == 1 {
			init = true
		}
	}
	if !init {
		return fmt.Errorf("%w: its init is not a process of the container", errNotConfined)
	}
	return nil
}

// nsInode is the inode of a process's PID namespace (0: unreadable).
func nsInode(pid int) uint64 {
	ino, _ := proc.PIDNamespace(pid)
	return ino
}
