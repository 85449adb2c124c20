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

// Container is the cgroup of one container (or any process group) that
// cpuslot carves slots out of.
type Container struct {
	h *Hierarchy
	// Path is the cgroup path relative to the hierarchy root.
	Path    string
	dirs    []string
	observe Observer

	mu         sync.Mutex
	cpuEnabled bool // v2: we wrote +cpu to cgroup.subtree_control
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
	for _, d := range c.dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("container cgroup %s: %w", d, errOr(err, syscall.ENOTDIR))
		}
	}
	if h.Version == 2 {
		ctrls, err := os.ReadFile(filepath.Join(c.dirs[0], "cgroup.controllers"))
		if err != nil {
			return nil, err
		}
		if !hasOpt(strings.Fields(string(ctrls)), "cpu") {
			return nil, fmt.Errorf("cgroup %s lacks the cpu controller: enable +cpu in its parent's cgroup.subtree_control", rel)
		}
		sub, err := os.ReadFile(filepath.Join(c.dirs[0], "cgroup.subtree_control"))
		if err != nil {
			return nil, err
		}
		c.cpuEnabled = hasOpt(strings.Fields(string(sub)), "cpu")
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

// Exists reports whether the container's cgroup directory is still there.
func (c *Container) Exists() bool {
	_, err := os.Stat(c.dirs[0])
	return err == nil
}

// LimitMilli returns the container's own CPU limit in millicores, or 0
// when it has none.
func (c *Container) LimitMilli() (uint32, error) {
	var quota, period int64
	if c.h.Version == 2 {
		b, err := os.ReadFile(filepath.Join(c.dirs[0], "cpu.max"))
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return 0, fmt.Errorf("unexpected cpu.max %q", b)
		}
		if f[0] == "max" {
			return 0, nil
		}
		quota, _ = strconv.ParseInt(f[0], 10, 64)
		period, _ = strconv.ParseInt(f[1], 10, 64)
	} else {
		var err error
		if quota, err = readInt(filepath.Join(c.dirs[0], "cpu.cfs_quota_us")); err != nil {
			return 0, err
		}
		if quota < 0 {
			return 0, nil
		}
		if period, err = readInt(filepath.Join(c.dirs[0], "cpu.cfs_period_us")); err != nil {
			return 0, err
		}
	}
	if period <= 0 {
		return 0, fmt.Errorf("cgroup %s: period %d", c.Path, period)
	}
	return uint32(quota * 1000 / period), nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// ensureCPU enables the cpu controller for the container's threaded
// children (v2). It must run after the first child became threaded: the
// container has processes, and only a threaded subtree lets a cgroup with
// processes enable a controller for its children.
func (c *Container) ensureCPU() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cpuEnabled {
		return nil
	}
	if err := os.WriteFile(filepath.Join(c.dirs[0], "cgroup.subtree_control"), []byte("+cpu"), 0); err != nil {
		return fmt.Errorf("enabling +cpu in %s/cgroup.subtree_control: %w", c.Path, err)
	}
	c.cpuEnabled = true
	return nil
}

// CreateSlot makes slot id with spec, ready to take threads. On failure
// nothing is left behind.
func (c *Container) CreateSlot(id uint32, spec Spec) (s *Slot, err error) {
	name := SlotName(id)
	start := time.Now()
	var made []string
	defer func() {
		if err != nil {
			for i := len(made) - 1; i >= 0; i-- {
				_ = syscall.Rmdir(made[i])
			}
		}
	}()
	for _, d := range c.dirs {
		dir := filepath.Join(d, name)
		if err = os.Mkdir(dir, 0o755); err != nil {
			c.observe(OpMkdir, time.Since(start), err)
			return nil, classify(fmt.Errorf("creating slot %s: %w", dir, err))
		}
		made = append(made, dir)
	}
	if c.h.Version == 2 {
		if err = os.WriteFile(filepath.Join(made[0], "cgroup.type"), []byte("threaded"), 0); err != nil {
			c.observe(OpMkdir, time.Since(start), err)
			return nil, fmt.Errorf("making slot %s threaded: %w", made[0], err)
		}
		if err = c.ensureCPU(); err != nil {
			c.observe(OpMkdir, time.Since(start), err)
			return nil, err
		}
	}
	c.observe(OpMkdir, time.Since(start), nil)
	s, err = c.openSlot(id, made)
	if err != nil {
		return nil, err
	}
	if err = s.apply(spec, true); err != nil {
		s.closeFiles()
		return nil, err
	}
	return s, nil
}

// AdoptSlots opens the slots an earlier agent left in this container,
// repairing half-made ones (a crash between two mkdirs, or before the slot
// became threaded). Their specs are read back from the kernel.
func (c *Container) AdoptSlots() ([]*Slot, error) {
	ids := map[uint32]bool{}
	for _, d := range c.dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if id, ok := ParseSlotName(e.Name()); ok && e.IsDir() {
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
		var dirs []string
		for _, d := range c.dirs {
			dir := filepath.Join(d, SlotName(id))
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				closeAll(slots)
				return nil, fmt.Errorf("repairing slot %s: %w", dir, err)
			}
			dirs = append(dirs, dir)
		}
		if c.h.Version == 2 {
			if err := c.adoptThreaded(dirs[0]); err != nil {
				closeAll(slots)
				return nil, err
			}
		}
		s, err := c.openSlot(id, dirs)
		if err != nil {
			closeAll(slots)
			return nil, err
		}
		if s.spec, err = s.readSpec(); err != nil {
			s.closeFiles()
			closeAll(slots)
			return nil, err
		}
		slots = append(slots, s)
	}
	return slots, nil
}

func (c *Container) adoptThreaded(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.type"))
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(b)) != "threaded" {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.type"), []byte("threaded"), 0); err != nil {
			return fmt.Errorf("making adopted slot %s threaded: %w", dir, err)
		}
	}
	return c.ensureCPU()
}

func closeAll(slots []*Slot) {
	for _, s := range slots {
		s.closeFiles()
	}
}

func isSlot(name string) bool {
	_, ok := ParseSlotName(name)
	return ok
}

// ErrNotInSlot is returned by MoveIn for a thread that sits in no slot of
// the container: a recorded TID that has exited, or been reused since.
var ErrNotInSlot = errors.New("thread is not in a slot of this container")

// MoveIn moves a thread (a TID in the agent's PID namespace) out of a slot
// into the container's own cgroup. Only a thread that sits in one of the
// container's slots now is moved: a TID recorded earlier may belong to
// another process by now.
func (c *Container) MoveIn(tid int) error {
	if p, err := c.h.PathOfThread(tid, tid); err != nil || path.Dir(p) != c.Path || !isSlot(path.Base(p)) {
		return fmt.Errorf("thread %d: %w", tid, ErrNotInSlot)
	}
	start := time.Now()
	b := strconv.AppendInt(nil, int64(tid), 10)
	var err error
	for _, d := range c.dirs {
		if werr := os.WriteFile(filepath.Join(d, c.h.threadsFile()), b, 0); werr != nil && err == nil {
			err = fmt.Errorf("moving thread %d back to %s: %w", tid, c.Path, werr)
		}
	}
	c.observe(OpMoveOut, time.Since(start), err)
	return err
}

// Populated reports whether any thread is left in the container or its slots.
func (c *Container) Populated() (bool, error) {
	if c.h.Version == 2 {
		lines, err := readLines(filepath.Join(c.dirs[0], "cgroup.events"))
		if err != nil {
			return false, err
		}
		for _, l := range lines {
			if l == "populated 1" {
				return true, nil
			}
		}
		return false, nil
	}
	var found bool
	err := filepath.WalkDir(c.dirs[0], func(p string, d os.DirEntry, err error) error {
		if err != nil || found || !d.IsDir() {
			return err
		}
		lines, err := readLines(filepath.Join(p, "tasks"))
		if err != nil {
			return err
		}
		found = len(lines) > 0
		return nil
	})
	return found, err
}

// Release undoes what preparing the container changed (v2: the +cpu in
// cgroup.subtree_control), once no slot is left. Runtimes that re-apply the
// container's resources expect a plain domain cgroup.
func (c *Container) Release() error {
	if c.h.Version != 2 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.cpuEnabled {
		return nil
	}
	entries, err := os.ReadDir(c.dirs[0])
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			return nil // children left (ours or not): +cpu stays
		}
	}
	if err := os.WriteFile(filepath.Join(c.dirs[0], "cgroup.subtree_control"), []byte("-cpu"), 0); err != nil {
		return fmt.Errorf("disabling cpu in %s/cgroup.subtree_control: %w", c.Path, err)
	}
	c.cpuEnabled = false
	return nil
}

// ErrLimitReached means the kernel refused a new cgroup
// (cgroup.max.descendants or cgroup.max.depth).
var ErrLimitReached = errors.New("cgroup limit reached")

// ErrBusy means a slot could not be removed because threads kept arriving.
var ErrBusy = errors.New("slot still has threads")

func classify(err error) error {
	if errors.Is(err, syscall.EAGAIN) {
		return fmt.Errorf("%w: %w", ErrLimitReached, err)
	}
	return err
}

// RemoveAllSlots finds every slot below the cgroup path under (in the cpu
// hierarchy) and removes it, moving its threads back to its container. It
// is the uninstall path: afterwards no cpuslot directory is left.
func (h *Hierarchy) RemoveAllSlots(under string) (int, error) {
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
				parents["/"+strings.TrimPrefix(rel, ".")] = true
				return filepath.SkipDir
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for p := range parents {
		c, err := h.Container(filepath.Clean(p), nil)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		slots, err := c.AdoptSlots()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, s := range slots {
			if err := s.Remove(); err != nil {
				errs = append(errs, err)
				continue
			}
			n++
		}
		if err := c.Release(); err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}
