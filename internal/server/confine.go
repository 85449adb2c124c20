package server

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/pool"
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

// errOwnUserNS: the peer lives in a user namespace no container runtime
// made: one a process made (as any user can), with a PID namespace of its
// own that the rule below would pass once the process that made it is
// gone.
var errOwnUserNS = errors.New("the peer's user namespace is not its container's")

// runtimeUserNS checks that process pid lives in the agent's user
// namespace (a pod without user namespaces) or in a child of it made by
// root (a container runtime's, for a pod with one).
func runtimeUserNS(pid int) error {
	self, err := agentUserNS()
	if err != nil {
		return fmt.Errorf("%w: the agent's own: %v", errOwnUserNS, err)
	}
	u, err := proc.UserNamespace(pid)
	if err != nil {
		return fmt.Errorf("%w: %v", errOwnUserNS, err)
	}
	if u.Ino == self || u.Parent == self && u.Owner == 0 {
		return nil
	}
	return fmt.Errorf("%w: user namespace %d, made by uid %d", errOwnUserNS, u.Ino, u.Owner)
}

var agentUserNS = sync.OnceValues(func() (uint64, error) {
	u, err := proc.UserNamespace(os.Getpid())
	return u.Ino, err
})

// errNotConfined: the container has a process the peer's fds could reach
// beyond its PID namespace, or that namespace's init lives elsewhere.
var errNotConfined = errors.New("PID namespace does not hold the whole container")

// errFDsRevoked: a slot of the container held a thread of another cgroup
// (its fds were passed on); it is served by agent placement for a while.
var errFDsRevoked = errors.New("the container's slot fds were passed on to another cgroup")

// RevokeFDs closes every connection that may hold fds of pl's slots (v1),
// HOLD-only and HOLD_LIST ones included: their leases end, and their clients'
// next HELLO gets AGENT_PLACES while pl.FDsRevoked. It returns how many
// it closed.
func (s *Server) RevokeFDs(pl *pool.Pool) int {
	s.mu.Lock()
	var hit []*conn
	for c := range s.conns {
		if c.fdPool.Load() == pl {
			hit = append(hit, c)
		}
	}
	s.mu.Unlock()
	for _, c := range hit {
		s.metrics.Error(metrics.FDsRevoked)
		c.c.Close()
	}
	return len(hit)
}

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

// passesFDs reports why a peer may not hold placement fds (nil: it may).
// On v2 the kernel lets a placement fd move only threads of the
// container's own threaded subtree. On v1 it checks nothing but the
// opener (the agent), so a holder could move any process it can name: fds
// go only to a peer whose PID namespace holds its whole container
// (confined), in a user namespace a runtime made (runtimeUserNS), of a
// container whose fds were not found passed on (pool.FDsRevoked), and to
// the agent's own process, which holds them anyway.
// Everyone else has the agent place its threads (docs/security.md).
func (c *conn) passesFDs() (err error) {
	s := c.srv
	if s.hierarchy.ConfinesFDs() {
		return nil
	}
	// Marked before the pool is asked: RevokeFDs closes the connection,
	// or the pool says its fds are revoked.
	c.fdPool.Store(c.pool)
	defer func() {
		if err != nil {
			c.fdPool.Store(nil)
		}
	}()
	if c.pool.FDsRevoked() {
		return errFDsRevoked
	}
	if c.peer.PID == s.self || s.limits.HostNamespaceFDs {
		return nil
	}
	if c.peer.NS == s.selfNS {
		return errors.New("the peer is in the agent's PID namespace")
	}
	if err := runtimeUserNS(c.peer.PID); err != nil {
		return err
	}
	if err := s.confinedPool(c.peer.NS, c.pool, c.resolve, false); err != nil {
		return err
	}
	c.confine = true
	c.confinedAt.Store(time.Now().UnixNano())
	return c.alive() // the namespace read at accept is the peer's
}

// recheckConfined checks again, at most every confineRecheck and off the
// request's path, that a v1 connection holding fds still meets passesFDs:
// the container may have gained a process outside the peer's namespace
// (the runtime's exec into a host-namespace container). If not, every fd
// connection of the container is closed; the client's next HELLO gets
// AGENT_PLACES.
func (c *conn) recheckConfined() {
	if !c.fds || !c.confine || time.Since(time.Unix(0, c.confinedAt.Load())) < confineRecheck ||
		!c.rechecking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer c.rechecking.Store(false)
		err := c.srv.confinedPool(c.peer.NS, c.pool, c.resolve, false)
		if err == nil {
			c.confinedAt.Store(time.Now().UnixNano())
			return
		}
		c.srv.log.Warn("container no longer confined to the peer's PID namespace; closing its fd connections",
			"container", c.pool.Name(), "pid", c.peer.PID, "err", err)
		c.srv.RevokeFDs(c.pool)
	}()
}

// RecheckFDs checks the v1 rule again for every connection that holds fds
// by it, those that send no ACQUIRE or RECLAIM (HOLD-only, HOLD_LIST, idle)
// included, and closes every fd connection of a container that no longer
// meets it. The agent's maintenance round calls it.
func (s *Server) RecheckFDs() {
	if s.hierarchy.ConfinesFDs() || s.limits.HostNamespaceFDs {
		return
	}
	type check struct {
		pl *pool.Pool
		ns uint64
	}
	checks := map[check]Resolver{}
	s.mu.Lock()
	for c := range s.conns {
		// c.peer was set before fdPool, in the connection's goroutine.
		if pl := c.fdPool.Load(); pl != nil && c.peer.PID != s.self {
			checks[check{pl, c.peer.NS}] = c.resolve
		}
	}
	s.mu.Unlock()
	for k, r := range checks {
		if err := s.confinedPool(k.ns, k.pl, r, true); err != nil {
			s.log.Warn("container no longer confined to the peer's PID namespace; closing its fd connections",
				"container", k.pl.Name(), "err", err)
			s.RevokeFDs(k.pl)
		}
	}
}

// confinedPool is confined for the processes of the container pl serves,
// remembered for confineRecheck per pool and namespace, so that the
// connections of one pod share one walk of its cgroups (fresh: walk
// anyway).
func (s *Server) confinedPool(ns uint64, pl *pool.Pool, r Resolver, fresh bool) error {
	now := time.Now()
	s.mu.Lock()
	if e, ok := s.confinedCache[pl]; ok && e.ns == ns && now.Sub(e.at) < confineRecheck && !fresh {
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
