package agent

// Resolving a connecting process (a server.Peer) to its container's pool,
// and the checks the server asks of the agent on every later request.

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/pool"
	"github.com/cpuslot/cpuslot/internal/server"
)

// containerResolver serves a container's own socket: the peer must be a
// process of that container.
type containerResolver struct {
	a          *Agent
	cgroupPath string
}

func (r containerResolver) Resolve(p server.Peer) (*pool.Pool, error) {
	pl, err := r.a.Resolve(p)
	if err != nil {
		return nil, err
	}
	r.a.mu.Lock()
	s := r.a.containers[r.cgroupPath]
	r.a.mu.Unlock()
	if s == nil || s.pool != pl {
		return nil, &server.NotServed{Reason: fmt.Sprintf("process %d is not in the container this socket belongs to", p.PID)}
	}
	return pl, nil
}

// Holds reports whether the peer is still a process of this socket's
// container, served by pl; it never prepares a pool.
func (r containerResolver) Holds(p server.Peer, pl *pool.Pool) bool {
	r.a.mu.Lock()
	s := r.a.containers[r.cgroupPath]
	r.a.mu.Unlock()
	return s != nil && s.pool == pl && r.a.Holds(p, pl)
}

// Processes lists the processes of the container pl serves.
func (r containerResolver) Processes(pl *pool.Pool) ([]int, error) { return r.a.Processes(pl) }

// Serving names the served container that holds cgroup cg.
func (r containerResolver) Serving(cg string) string { return r.a.Serving(cg) }

// Resolve finds the pool of a connecting process (server.Resolver).
func (a *Agent) Resolve(p server.Peer) (*pool.Pool, error) {
	if pl := a.servedAtAccept(p); pl != nil {
		return pl, nil
	}
	// Its cgroup at accept names no container served since before then
	// (a new one is to be made, or one was made since, perhaps anew at a
	// path the peer has left): the peer is found where it is now.
	cg, err := a.hierarchy.PathOfPID(p.PID)
	if err != nil {
		return nil, &server.NotServed{Reason: fmt.Sprintf("cannot read the cgroup of process %d: %v", p.PID, err)}
	}
	var best *served
	for {
		a.mu.Lock()
		var bestPath string
		best, bestPath = a.servingLocked(cg)
		// A container whose pool is being made is served once it is made.
		var wait *preparation
		for path, pr := range a.preparing {
			if within(cg, path) && len(path) > len(bestPath) {
				wait, bestPath = pr, path
			}
		}
		a.mu.Unlock()
		if wait == nil {
			break
		}
		<-wait.done
	}
	if best != nil {
		if p := a.current(best); p != nil {
			return p, nil
		}
		// Made anew at the same path: a new container, served afresh.
		s, err := a.serveWith(best.Container, best.auto, best.ln)
		if err != nil {
			return nil, serveError(best.CgroupPath, err)
		}
		return s.pool, nil
	}
	if a.underServeUnder(cg) {
		ctr := containerOf(cg)
		s, err := a.serve(discover.Container{Name: ctr, CgroupPath: ctr}, true)
		if err != nil {
			return nil, serveError(ctr, err)
		}
		return s.pool, nil
	}
	return nil, &server.NotServed{Reason: fmt.Sprintf("process %d in cgroup %s is not in a container this agent serves", p.PID, cg)}
}

// servedAtAccept is the pool of the container that held the peer's cgroup
// at accept (p.Cgroup), if that container was served before the accept and
// is still served: the peer was in it then, so its connection is served as
// if it had said HELLO at once (a move since is caught as one after HELLO
// is: Holds, the v1 fd rule, the kernel on v2). nil: the cgroup must be
// read again.
func (a *Agent) servedAtAccept(p server.Peer) *pool.Pool {
	if p.Cgroup == "" {
		return nil
	}
	a.mu.Lock()
	best, bestPath := a.servingLocked(p.Cgroup)
	for path := range a.preparing {
		if within(p.Cgroup, path) && len(path) > len(bestPath) {
			best = nil // a deeper container is being made
		}
	}
	a.mu.Unlock()
	if best == nil || best.pinned.After(p.Accepted) {
		return nil
	}
	return a.current(best)
}

// Holds reports whether the peer's process is still in the container
// that pl serves (server.Resolver). Unlike Resolve it never prepares a
// pool: a peer that moved to another cgroup below a serve-under root must
// not make the agent create slots there by asking for a placement.
func (a *Agent) Holds(p server.Peer, pl *pool.Pool) bool {
	cg, err := a.hierarchy.PathOfPID(p.PID)
	if err != nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	best, _ := a.servingLocked(cg)
	return best != nil && best.pool == pl && !pl.Stale()
}

// Processes lists the processes of the container pl serves, in its cgroup
// and below (server.Resolver).
func (a *Agent) Processes(pl *pool.Pool) ([]int, error) {
	a.mu.Lock()
	var cg *cgroup.Container
	for _, s := range a.containers {
		if s.pool == pl {
			cg = s.cg
			break
		}
	}
	a.mu.Unlock()
	if cg == nil {
		return nil, errors.New("container no longer served")
	}
	return cg.Processes()
}

// Serving names the served container that holds cgroup cg ("": none); it
// never prepares a pool (server.Resolver).
func (a *Agent) Serving(cg string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, path := a.servingLocked(cg)
	return path
}

// servingLocked is the served container that holds cgroup cg (the deepest
// one), and its path; a.mu is held.
func (a *Agent) servingLocked(cg string) (*served, string) {
	var best *served
	bestPath := ""
	for path, s := range a.containers {
		if within(cg, path) && len(path) >= len(bestPath) {
			best, bestPath = s, path
		}
	}
	return best, bestPath
}

// within reports whether cgroup path p is dir or below it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// containerOf strips a trailing slot from a process's cgroup path: a
// process whose main thread sits in a slot belongs to the slot's container.
func containerOf(p string) string {
	if _, ok := cgroup.ParseSlotName(path.Base(p)); ok {
		return path.Dir(p)
	}
	return p
}
