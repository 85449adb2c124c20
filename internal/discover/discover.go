// Package discover finds the containers the agent serves. A Source reports
// containers as they appear and disappear; the agent prepares a pool for
// each. Standalone mode serves cgroups named by path or by a process in
// them; Kubernetes mode (package kubernetes) watches the node's pods.
package discover

import (
	"context"
	"fmt"
	"path"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// Container is one container to serve.
type Container struct {
	// Name identifies the container in logs, metrics and HELLO.
	Name string
	// CgroupPath is the container's cgroup, relative to the cpu hierarchy.
	CgroupPath string
	// Pool overrides the agent's default pool settings when set.
	Pool *settings.Pool
	// Socket, when set, is a socket of this container's own: the agent
	// listens there and accepts only processes of this container.
	Socket string
	// FirstSlots makes Prepare return once one slot of each pre-warmed
	// quota and the socket are ready; the rest are made after it returns
	// (a runtime waits on it to start the container).
	FirstSlots bool
}

// Partial is what Prepare returns when the container is served but not as
// configured (for example fewer slots pre-warmed than asked).
type Partial struct{ Err error }

func (p *Partial) Error() string { return "served with problems: " + p.Err.Error() }
func (p *Partial) Unwrap() error { return p.Err }

// Sink receives what a Source discovers.
type Sink interface {
	// Prepare prepares (or updates) a container's pool.
	Prepare(Container) error
	// Forget tears a container's pool down and removes its slots.
	Forget(cgroupPath string)
	// Resize passes on the CPU limit (millicores, 0: none) a served
	// container's orchestrator asks for before the kernel has it (an
	// in-place resize): slots above it go first, as cgroup v1 refuses a
	// container a quota below a child's.
	Resize(cgroupPath string, limitMilli uint32)
}

// Reporter is a Source that can tell the owner of a container what the
// agent found (Kubernetes: an Event on the pod).
type Reporter interface {
	// Report tells the owner of the served container that holds cgroup
	// path cg, if the source serves one.
	Report(cg, reason, message string)
}

// ReasonForeignThread: on cgroup v1, a thread of another cgroup was found
// in a slot (the slot's placement fds were passed on).
const ReasonForeignThread = "CpuslotForeignThread"

// Source reports containers to a Sink until ctx ends.
type Source interface {
	Run(ctx context.Context, sink Sink) error
}

// Static serves a fixed list of cgroups and processes (standalone mode).
type Static struct {
	Hierarchy *cgroup.Hierarchy
	Cgroups   []string
	PIDs      []int
}

// Run serves each configured container once; a failure is reported but
// does not stop the others.
func (s Static) Run(ctx context.Context, sink Sink) error {
	var first error
	add := func(c Container) {
		if err := sink.Prepare(c); err != nil && first == nil {
			first = err
		}
	}
	for _, p := range s.Cgroups {
		add(Container{Name: p, CgroupPath: p})
	}
	for _, pid := range s.PIDs {
		p, err := s.Hierarchy.PathOfPID(pid)
		if err != nil {
			if first == nil {
				first = fmt.Errorf("process %d: %w", pid, err)
			}
			continue
		}
		// Its main thread may sit in one of its slots (an agent restarted).
		if _, ok := cgroup.ParseSlotName(path.Base(p)); ok {
			p = path.Dir(p)
		}
		add(Container{Name: p, CgroupPath: p})
	}
	return first
}
