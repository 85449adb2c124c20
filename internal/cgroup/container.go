package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SlotPrefix starts the directory name of every slot; the rest of the name
// is the slot id, which is all an agent needs to adopt the slot after a
// restart (the quota is read back from the slot's own files).
const SlotPrefix = "cpuslot-"

// SlotName is the directory name of slot id.
func SlotName(id uint32) string { return SlotPrefix + strconv.FormatUint(uint64(id), 10) }

// ParseSlotName returns the id in a slot directory name.
func ParseSlotName(name string) (uint32, bool) {
	rest, ok := strings.CutPrefix(name, SlotPrefix)
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseUint(rest, 10, 32)
	if err != nil || id == 0 || SlotName(uint32(id)) != name {
		return 0, false
	}
	return uint32(id), true
}

// Observer is told how long each cgroup operation took; it feeds metrics.
type Observer func(op string, d time.Duration, err error)

// Op names passed to an Observer.
const (
	OpMkdir    = "mkdir"
	OpSetQuota = "set_quota"
	OpPlace    = "place"
	OpMoveOut  = "move_out"
	OpRmdir    = "rmdir"
	OpReadStat = "read_stat"
)

// Ops lists every Op name.
var Ops = []string{OpMkdir, OpSetQuota, OpPlace, OpMoveOut, OpRmdir, OpReadStat}

// Container is the cgroup of one container (or any process group) that
// cpuslot carves slots out of.
type Container struct {
	h *Hierarchy
	// Path is the cgroup path relative to the hierarchy root.
	Path    string
	dirs    []string
	observe Observer

	// fds are the container's directories, one per hierarchy (dirfd.go);
	// id is the identity of the first.
	fds  []int
	id   Identity
	fdMu sync.RWMutex

	// witness tells the container's threads from others' (v1; nil: none).
	witness *Witness
	// onForeign is told of each foreign thread moved out of a slot.
	onForeign func(Foreign)

	mu         sync.Mutex
	cpuEnabled bool // v2: we wrote +cpu to cgroup.subtree_control
	scanNext   int  // where EvictForeign goes on
}

// Container opens the cgroup at a relative path. On v2 it checks that the
// cpu controller is available there.
func (h *Hierarchy) Container(rel string, observe Observer) (*Container, error) {
	if rel == "" || !strings.HasPrefix(rel, "/") || strings.Contains(rel, "..") {
		return nil, fmt.Errorf("cgroup path %q must be absolute within the hierarchy", rel)
	}
	rel = filepath.Clean(rel)
	if observe == nil {
		observe = func(string, time.Duration, error) {}
	}
	c := &Container{h: h, Path: rel, dirs: h.dirs(rel), observe: observe}
	for i, d := range c.dirs {
		fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("container cgroup %s: %w", d, err)
		}
		c.fds = append(c.fds, fd)
		if i == 0 {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				c.Close()
				return nil, err
			}
			c.id = identityOf(&st)
		}
	}
	if err := h.v.openContainer(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func errOr(err, alt error) error {
	if err != nil {
		return err
	}
	return alt
}

// Hierarchy returns the hierarchy the container lives in.
func (c *Container) Hierarchy() *Hierarchy { return c.h }

// Exists reports whether the container's cgroup directory is still there:
// the path names the very directory the container was opened at.
func (c *Container) Exists() bool {
	id, err := c.h.IdentityOf(c.Path)
	return err == nil && id == c.id
}

// LimitMilli returns the container's own CPU limit in millicores, or 0
// when it has none.
func (c *Container) LimitMilli() (uint32, error) {
	return c.h.v.limitMilli(c)
}

// limitOf turns a quota and period read from the container into millicores.
func limitOf(c *Container, quota, period int64) (uint32, error) {
	if period <= 0 {
		return 0, fmt.Errorf("cgroup %s: period %d", c.Path, period)
	}
	return uint32(quota * 1000 / period), nil
}

func (c *Container) readInt(name string) (int64, error) {
	b, err := c.readAt(0, name)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// CreateSlot makes slot id with spec, ready to take threads. On failure
// nothing is left behind.
func (c *Container) CreateSlot(id uint32, spec Spec) (s *Slot, err error) {
	s = c.slot(id)
	name := s.name
	start := time.Now()
	made := 0
	defer func() {
		if err != nil {
			for i := made - 1; i >= 0; i-- {
				_ = c.rmdirAt(i, name)
			}
			err = c.gone(err)
		}
	}()
	for i := range c.dirs {
		if err = c.mkdirAt(i, s.name); err != nil {
			c.observe(OpMkdir, time.Since(start), err)
			return nil, classify(fmt.Errorf("creating slot: %w", err))
		}
		made++
	}
	if err = c.h.v.prepareSlot(c, s); err != nil {
		c.observe(OpMkdir, time.Since(start), err)
		return nil, err
	}
	c.observe(OpMkdir, time.Since(start), nil)
	if err = s.apply(spec, true); err != nil {
		return nil, err
	}
	return s, nil
}

// AdoptSlots opens the slots an earlier agent left in this container,
// repairing half-made ones (a crash between two mkdirs, or before the slot
// became threaded). Their specs are read back from the kernel.
func (c *Container) AdoptSlots() ([]*Slot, error) {
	ids := map[uint32]bool{}
	for i := range c.dirs {
		names, err := c.subdirs(i)
		if err != nil {
			return nil, c.gone(err)
		}
		for _, n := range names {
			if id, ok := ParseSlotName(n); ok {
				ids[id] = true
			}
		}
	}
	var sorted []uint32
	for id := range ids {
		sorted = append(sorted, id)
	}
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	var slots []*Slot
	for _, id := range sorted {
		s := c.slot(id)
		for i := range c.dirs {
			if err := c.mkdirAt(i, s.name); err != nil && !errors.Is(err, os.ErrExist) {
				return nil, c.gone(fmt.Errorf("repairing slot: %w", err))
			}
		}
		if err := c.h.v.adoptSlot(c, s); err != nil {
			return nil, c.gone(err)
		}
		var err error
		if s.spec, err = s.readSpec(); err != nil {
			return nil, c.gone(err)
		}
		slots = append(slots, s)
	}
	return slots, nil
}

func isSlot(name string) bool {
	_, ok := ParseSlotName(name)
	return ok
}

// ErrNotInSlot is returned by MoveOut for a thread that sits in no slot of
// the container: a recorded TID that has exited, or been reused since.
var ErrNotInSlot = errors.New("thread is not in a slot of this container")

// MoveOut moves a thread (a TID in the agent's PID namespace) out of a slot
// into the container's own cgroup. Only a thread that sits in one of the
// container's slots now is moved: a TID recorded earlier may belong to
// another process by now.
//
// A thread of another container (v1: it wrote itself in with fds passed
// on) goes back to its own cgroup instead, and is reported (OnForeign):
// in the container's cgroup no slot scan would find it.
func (c *Container) MoveOut(tid int) error {
	own, err := threadCgroups(tid)
	inSlot := func(p string) bool { return path.Dir(p) == c.Path && isSlot(path.Base(p)) }
	p := own[c.h.cpuKey()]
	if err == nil && !inSlot(p) && c.h.AcctRoot != "" {
		p = own["cpuacct"] // a holder of fds may write the cpuacct one only
	}
	if err != nil || !inSlot(p) {
		return fmt.Errorf("thread %d: %w", tid, ErrNotInSlot)
	}
	// Only by a witness: the leader's cgroup (the scan's fallback) costs
	// two more reads on a release path, and a tenant can move it anyway.
	if c.witness != nil {
		if f, ok := c.foreignIn(path.Base(p), tid, own); ok {
			c.report(f)
			return f.Err
		}
	}
	start := time.Now()
	b := strconv.Itoa(tid)
	err = nil
	for i := range c.dirs {
		if werr := c.writeAt(i, c.h.ThreadsFile(), b); werr != nil && err == nil {
			err = c.gone(fmt.Errorf("moving thread %d back to %s: %w", tid, c.Path, werr))
		}
	}
	c.observe(OpMoveOut, time.Since(start), err)
	return err
}

// Populated reports whether any thread is left in the container or its
// cgroups below.
func (c *Container) Populated() (bool, error) {
	found, err := c.h.v.populated(c)
	return found, c.gone(err)
}

// maxWalkDepth bounds a walk of a tree the container's owner may shape.
const maxWalkDepth = 32

// Unprepare undoes what preparing the container changed (v2: the +cpu in
// cgroup.subtree_control), once no slot is left. Runtimes that re-apply the
// container's resources expect a plain domain cgroup.
func (c *Container) Unprepare() error {
	return c.h.v.unprepare(c)
}

// ErrLimitReached means the kernel refused a new cgroup
// (cgroup.max.descendants or cgroup.max.depth).
var ErrLimitReached = errors.New("cgroup limit reached")

// ErrBusy means a slot could not be removed: threads kept arriving, or a
// cgroup was made inside it (then the error is a *ChildCgroupError).
var ErrBusy = errors.New("slot still has threads")

// ChildCgroupError says that a slot could not be removed because a cgroup
// the agent did not make sits inside it. The agent leaves that cgroup
// alone (it removes only what it made); whoever made it must remove it.
type ChildCgroupError struct {
	Slot, Child string
}

func (e *ChildCgroupError) Error() string {
	return fmt.Sprintf("slot %s has a child cgroup %q, which the agent did not make and leaves alone", e.Slot, e.Child)
}

// Is makes a ChildCgroupError an ErrBusy: the slot is retried like one
// whose threads keep arriving.
func (e *ChildCgroupError) Is(target error) bool { return target == ErrBusy }

func classify(err error) error {
	if errors.Is(err, syscall.EAGAIN) {
		return fmt.Errorf("%w: %w", ErrLimitReached, err)
	}
	return err
}

// RemoveSlots removes every slot of the container, moving threads back to
// it, and undoes its preparation.
func (c *Container) RemoveSlots() (int, error) {
	slots, err := c.AdoptSlots()
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, s := range slots {
		if err := s.Remove(); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	if len(errs) == 0 {
		errs = append(errs, c.Unprepare())
	}
	return n, errors.Join(errs...)
}

// SlotParents lists the cgroups below under (cpu hierarchy, relative paths)
// that hold slots.
func (h *Hierarchy) SlotParents(under string) ([]string, error) {
	parents := map[string]bool{}
	root := filepath.Join(h.CPURoot, under)
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			if _, ok := ParseSlotName(d.Name()); ok {
				rel, _ := filepath.Rel(h.CPURoot, filepath.Dir(p))
				parents[filepath.Clean("/"+rel)] = true
				return filepath.SkipDir
			}
		}
		return nil
	})
	out := make([]string, 0, len(parents))
	for p := range parents {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, err
}

// RemoveAllSlots finds every slot below the cgroup path under (in the cpu
// hierarchy) and removes it, moving its threads back to its container. It
// is the uninstall path: afterwards no cpuslot directory is left.
func (h *Hierarchy) RemoveAllSlots(under string) (int, error) {
	parents, err := h.SlotParents(under)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, p := range parents {
		c, err := h.Container(p, nil)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m, err := c.RemoveSlots()
		c.Close()
		n += m
		if err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// MaxProcesses bounds Processes: a container with more is not listed.
const MaxProcesses = 1 << 16

// ErrTooManyProcesses: the container holds more than MaxProcesses
// processes.
var ErrTooManyProcesses = errors.New("container holds too many processes to list")

// Processes lists the processes (thread-group ids) in the container's
// cgroup and every cgroup below it (its slots included) in the cpu
// hierarchy. A process whose threads sit in several of them is listed once
// per cgroup.
func (c *Container) Processes() ([]int, error) {
	var pids []int
	err := c.processesIn(".", 0, &pids)
	return pids, c.gone(err)
}

func (c *Container) processesIn(rel string, depth int, pids *[]int) error {
	lines, err := c.linesAt(0, rel+"/cgroup.procs")
	if err != nil {
		return err
	}
	for _, l := range lines {
		pid, err := strconv.Atoi(l)
		if err != nil {
			return fmt.Errorf("cgroup %s/%s: bad pid %q", c.Path, rel, l)
		}
		*pids = append(*pids, pid)
	}
	if len(*pids) > MaxProcesses {
		return fmt.Errorf("cgroup %s: %w (more than %d)", c.Path, ErrTooManyProcesses, MaxProcesses)
	}
	if depth >= maxWalkDepth {
		return fmt.Errorf("cgroup %s/%s: deeper than %d levels", c.Path, rel, maxWalkDepth)
	}
	names, err := c.subdirsOf(0, rel)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := c.processesIn(rel+"/"+n, depth+1, pids); err != nil {
			return err
		}
	}
	return nil
}
