// Package cgroup prepares a container's cgroup for CPU slots and manages the
// slots themselves on cgroup v1 and v2. It holds every cgroup file operation
// of cpuslot. A container's files and slots are reached relative to the
// container's directory fds, never by path (dirfd.go).
//
// The version is chosen once: Detect picks v1 (v1.go) or v2 (v2.go), the
// two implementations of the version interface (version.go), and
// everything else asks for what it needs (ConfinesFDs, SlotFDs, a slot's
// quota written) instead of comparing version numbers. Before, 24 places
// outside detection compared Hierarchy.Version; now none does outside
// v1.go and v2.go but one benchmark label (docs/cgroups.md).
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// Hierarchy is where the cpu controller lives on this machine.
type Hierarchy struct {
	// Version is 1 or 2, for reports (logs, metrics, HELLO_OK). What
	// differs between the versions is asked of v.
	Version int `json:"version"`
	// FavorDynMods reports the cgroup2 mount option that makes thread
	// migration cheap (kernel 6.0+). Always false on v1.
	FavorDynMods bool `json:"favordynmods"`
	// CPURoot is the mount point of the cpu controller (v1) or of cgroup2.
	CPURoot string `json:"cpuRoot"`
	// AcctRoot is the mount point of cpuacct on v1 when it is mounted apart
	// from cpu; empty otherwise.
	AcctRoot string `json:"cpuacctRoot,omitempty"`
	// Witnesses are the other v1 hierarchies, which tell a container's
	// threads from those of others (foreign.go); none on v2.
	Witnesses []Witness `json:"witnesses,omitempty"`

	// v is what differs between the versions, picked at detection.
	v version
	// kept is the budget of fds its slots keep open (slot.go).
	kept fdBudget
}

func (h *Hierarchy) String() string { return h.v.describe(h) }

// ConfinesFDs reports whether the kernel lets a slot's placement fd move
// only threads of the container's own subtree (v2: its threaded subtree).
// Where it does not (v1), the holder of a passed fd can move any thread
// it can name into the slot (foreign.go).
func (h *Hierarchy) ConfinesFDs() bool { return h.v.confinesFDs() }

// Detect finds the cpu controller from /proc/self/mountinfo. A v1 mount of
// cpu wins over a cgroup2 mount (hybrid hosts keep cpu on v1); a cgroup2
// mount counts only when it offers the cpu controller. Only mounts of a
// hierarchy's root count: inside a container, runtimes mount the
// container's own cgroup (root /kubepods/...) at /sys/fs/cgroup, and the
// agent's host mount lies over it; of several, the last mounted under
// /sys/fs/cgroup is on top. Mounts elsewhere (another container's rootfs,
// propagated through a shared host mount) are used only when there is no
// other: they can vanish with that container.
func Detect() (*Hierarchy, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	h, err := detect(mounts, func(dir string) ([]byte, error) {
		return os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	})
	if err == nil && !h.ConfinesFDs() {
		h.Witnesses = witnessesIn(canonicalMounts(mounts))
	}
	return h, err
}

// canonicalMounts are the mounts under /sys/fs/cgroup, or all when none is.
func canonicalMounts(all []*mountinfo.Info) []*mountinfo.Info {
	var canonical []*mountinfo.Info
	for _, m := range all {
		if m.Mountpoint == "/sys/fs/cgroup" || strings.HasPrefix(m.Mountpoint, "/sys/fs/cgroup/") {
			canonical = append(canonical, m)
		}
	}
	if len(canonical) == 0 {
		return all
	}
	return canonical
}

func detect(all []*mountinfo.Info, controllers func(dir string) ([]byte, error)) (*Hierarchy, error) {
	if h, err := detectIn(canonicalMounts(all), controllers); err == nil {
		return h, nil
	}
	return detectIn(all, controllers)
}

func detectIn(mounts []*mountinfo.Info, controllers func(dir string) ([]byte, error)) (*Hierarchy, error) {
	var cpu, acct string
	for _, m := range mounts {
		if m.FSType != "cgroup" || m.Root != "/" {
			continue
		}
		opts := strings.Split(m.VFSOptions, ",")
		if hasOpt(opts, "cpu") {
			cpu, acct = m.Mountpoint, ""
			if hasOpt(opts, "cpuacct") {
				acct = m.Mountpoint
			}
		} else if hasOpt(opts, "cpuacct") {
			acct = m.Mountpoint
		}
	}
	if cpu != "" {
		h := &Hierarchy{Version: 1, CPURoot: cpu, v: v1{}}
		if acct != cpu {
			h.AcctRoot = acct
		}
		if h.AcctRoot == "" && acct == "" {
			return nil, errors.New("cgroup v1: cpu is mounted but cpuacct is not")
		}
		return h, nil
	}
	var found *Hierarchy
	for _, m := range mounts {
		if m.FSType != "cgroup2" || m.Root != "/" {
			continue
		}
		ctrls, err := controllers(m.Mountpoint)
		if err != nil || !hasOpt(strings.Fields(string(ctrls)), "cpu") {
			continue
		}
		found = &Hierarchy{
			Version:      2,
			v:            v2{},
			CPURoot:      m.Mountpoint,
			FavorDynMods: hasOpt(strings.Split(m.VFSOptions, ","), "favordynmods"),
		}
	}
	if found != nil {
		return found, nil
	}
	return nil, errors.New("no cgroup hierarchy with the cpu controller is mounted at its root")
}

func hasOpt(opts []string, want string) bool {
	for _, o := range opts {
		if o == want {
			return true
		}
	}
	return false
}

// PathOfPID returns the cgroup of a process (its thread-group leader) in the
// cpu hierarchy, as a path relative to the hierarchy root ("/a/b").
func (h *Hierarchy) PathOfPID(pid int) (string, error) {
	return h.pathFrom(fmt.Sprintf("/proc/%d/cgroup", pid))
}

// PathOfThread returns the cgroup one thread of a process sits in.
func (h *Hierarchy) PathOfThread(pid, tid int) (string, error) {
	return h.pathFrom(fmt.Sprintf("/proc/%d/task/%d/cgroup", pid, tid))
}

func (h *Hierarchy) pathFrom(file string) (string, error) {
	m, err := cgroupFile(file)
	if err != nil {
		return "", err
	}
	key := h.cpuKey()
	p, ok := m[key]
	if !ok {
		return "", fmt.Errorf("%s has no %q entry", file, key)
	}
	return p, nil
}

// ProcessCgroup is the cgroup a container's processes sit in, for the
// cgroup rel its OCI spec names: crun with the systemd cgroup manager (the
// CRI-O default) puts them in a "container" sub-cgroup of the scope, and
// slots must be made where the processes are. The runtime makes that
// sub-cgroup before any instruction of the container runs.
func (h *Hierarchy) ProcessCgroup(rel string) string {
	sub := filepath.Join(rel, "container")
	if fi, err := os.Stat(filepath.Join(h.CPURoot, sub)); err == nil && fi.IsDir() {
		return sub
	}
	return rel
}

// cpuKey names the cpu hierarchy in /proc/<pid>/cgroup.
func (h *Hierarchy) cpuKey() string { return h.v.cpuKey() }

// dirs are the absolute directories of one relative cgroup path: the cpu
// directory first, then the separate cpuacct one if there is one.
func (h *Hierarchy) dirs(rel string) []string {
	d := []string{filepath.Join(h.CPURoot, rel)}
	if h.AcctRoot != "" {
		d = append(d, filepath.Join(h.AcctRoot, rel))
	}
	return d
}

// SlotFDs says how many placement and counter fds each slot has.
func (h *Hierarchy) SlotFDs() (place, stat int) { return h.v.slotFDs(h) }

// DelegateCPU makes the cpu controller available to the cgroups below the
// one at rel (v2: +cpu in its cgroup.subtree_control), as a container
// runtime does for a pod. For tests and tools that make such cgroups.
func (h *Hierarchy) DelegateCPU(rel string) error { return h.v.delegateCPU(h, rel) }

// SetLimit gives the cgroup at rel a CPU limit of milli millicores per
// 100ms period, as a pod's limit would. For tests and tools.
func (h *Hierarchy) SetLimit(rel string, milli uint32) error { return h.v.setLimit(h, rel, milli) }

// ThreadsFile is the file a thread id is written to in order to move one
// thread (tasks on v1, cgroup.threads on v2).
func (h *Hierarchy) ThreadsFile() string { return h.v.threadsFile() }

// readLines reads a small cgroup file into its lines.
func readLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if l := strings.TrimSpace(s.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, s.Err()
}

// MoveProcess moves every thread of a process into the cgroup at rel, in
// each hierarchy the cpu controller spans.
func (h *Hierarchy) MoveProcess(pid int, rel string) error {
	for _, d := range h.dirs(rel) {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("moving process %d to %s: %w", pid, rel, err)
		}
	}
	return nil
}

// MoveThread moves one thread into the cgroup at rel, in each hierarchy
// the cpu controller spans.
func (h *Hierarchy) MoveThread(tid int, rel string) error {
	for _, d := range h.dirs(rel) {
		if err := os.WriteFile(filepath.Join(d, h.ThreadsFile()), []byte(strconv.Itoa(tid)), 0); err != nil {
			return fmt.Errorf("moving thread %d to %s: %w", tid, rel, err)
		}
	}
	return nil
}

// StartIn starts cmd inside the cgroup at rel. On v2 the child is born
// there (CLONE_INTO_CGROUP), so a new cgroup namespace is rooted there too.
// On v1 it is moved right after start: a child that must not run outside
// the cgroup should wait for a word on stdin from the caller.
func (h *Hierarchy) StartIn(cmd *exec.Cmd, rel string) error { return h.v.startIn(h, cmd, rel) }
