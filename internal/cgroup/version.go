package cgroup

import "os/exec"

// version is everything that differs between cgroup v1 (v1.go) and v2
// (v2.go). Detect picks one, once; the rest of the package, and its
// callers, ask it for what they need rather than compare version numbers
// (as containerd's core/metrics/cgroups keeps a v1 and a v2 collector).
type version interface {
	// describe says where the cpu controller lives, for logs.
	describe(h *Hierarchy) string
	// cpuKey names the cpu hierarchy in /proc/<pid>/cgroup.
	cpuKey() string
	// threadsFile is the file a thread id is written to in order to move
	// one thread.
	threadsFile() string
	// slotFDs says how many placement and counter fds each slot has.
	slotFDs(h *Hierarchy) (place, stat int)
	// startIn starts cmd inside the cgroup at rel.
	startIn(h *Hierarchy, cmd *exec.Cmd, rel string) error
	// delegateCPU makes the cpu controller available below the cgroup at
	// rel.
	delegateCPU(h *Hierarchy, rel string) error
	// setLimit gives the cgroup at rel a CPU limit per 100ms period.
	setLimit(h *Hierarchy, rel string, milli uint32) error
	// confinesFDs reports whether the kernel lets a placement fd move only
	// threads of the container's own subtree.
	confinesFDs() bool

	// openContainer checks and records what a newly opened container
	// needs (c.fds are open).
	openContainer(c *Container) error
	// limitMilli reads the container's own CPU limit (0: none).
	limitMilli(c *Container) (uint32, error)
	// prepareSlot readies a slot just made (directories exist).
	prepareSlot(c *Container, s *Slot) error
	// adoptSlot repairs a slot an earlier agent left.
	adoptSlot(c *Container, s *Slot) error
	// populated reports whether any thread is in the container or below.
	populated(c *Container) (bool, error)
	// unprepare undoes what preparing the container changed.
	unprepare(c *Container) error

	// openAcct opens the slot's separate usage counter (-1: none).
	openAcct(s *Slot) (int, error)
	// writeSpec writes what differs between spec and s.spec (all of spec
	// when fresh).
	writeSpec(s *Slot, spec Spec, fresh bool) error
	// readSpec reads back what a slot enforces.
	readSpec(s *Slot) (Spec, error)
}
