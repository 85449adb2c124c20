package cgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// v2 is cgroup v2: one hierarchy, slots are threaded children of the
// container, and the kernel lets a placement fd move only threads of the
// container's own threaded subtree.
type v2 struct{}

func (v2) describe(h *Hierarchy) string {
	return fmt.Sprintf("cgroup v2 at %s (favordynmods=%t)", h.CPURoot, h.FavorDynMods)
}

func (v2) cpuKey() string      { return "" }
func (v2) threadsFile() string { return "cgroup.threads" }
func (v2) confinesFDs() bool   { return true }

func (v2) slotFDs(*Hierarchy) (place, stat int) { return 1, 1 }

// startIn has the child born in the cgroup (CLONE_INTO_CGROUP), so a new
// cgroup namespace is rooted there too.
func (v2) startIn(h *Hierarchy, cmd *exec.Cmd, rel string) error {
	f, err := os.Open(filepath.Join(h.CPURoot, rel))
	if err != nil {
		return err
	}
	defer f.Close()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(f.Fd())
	return cmd.Start()
}

// ErrNotDelegated: the container's cgroup is a systemd unit that does not
// delegate its subtree. systemd then owns what is below it and may remove
// or reset slots on a daemon-reload or a property change, so none is made.
var ErrNotDelegated = errors.New("systemd unit does not delegate its cgroup (Delegate=yes)")

// checkDelegated refuses, on v2, a container cgroup that is a systemd unit
// (a .scope or .service, as the systemd cgroup driver makes them) without
// the trusted.delegate mark systemd sets on the units it delegates. Only
// a process with CAP_SYS_ADMIN on the host can set that mark, so a pod
// cannot forge it.
func (c *Container) checkDelegated() error {
	name := filepath.Base(c.Path)
	if !strings.HasSuffix(name, ".scope") && !strings.HasSuffix(name, ".service") {
		return nil
	}
	buf := make([]byte, 8)
	n, err := unix.Fgetxattr(c.fds[0], "trusted.delegate", buf)
	switch {
	case errors.Is(err, unix.ENODATA):
		return fmt.Errorf("cgroup %s: %w: it has no trusted.delegate mark", c.Path, ErrNotDelegated)
	case err != nil:
		return fmt.Errorf("cgroup %s: reading its trusted.delegate mark: %w", c.Path, err)
	case string(buf[:n]) != "1":
		return fmt.Errorf("cgroup %s: %w: trusted.delegate is %q", c.Path, ErrNotDelegated, buf[:n])
	}
	return nil
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
	if err := c.writeAt(0, "cgroup.subtree_control", "+cpu"); err != nil {
		return fmt.Errorf("enabling +cpu in %s/cgroup.subtree_control: %w", c.Path, err)
	}
	c.cpuEnabled = true
	return nil
}

func (v2) delegateCPU(h *Hierarchy, rel string) error {
	return os.WriteFile(filepath.Join(h.CPURoot, rel, "cgroup.subtree_control"), []byte("+cpu"), 0)
}

func (v2) setLimit(h *Hierarchy, rel string, milli uint32) error {
	return os.WriteFile(filepath.Join(h.CPURoot, rel, "cpu.max"), []byte(fmt.Sprintf("%d 100000", milli*100)), 0)
}

// openContainer checks that the cpu controller is available in the
// container and that systemd delegated it, and notes whether +cpu is
// already enabled for its children.
func (v2) openContainer(c *Container) error {
	ctrls, err := c.readAt(0, "cgroup.controllers")
	if err != nil {
		return err
	}
	if !hasOpt(strings.Fields(string(ctrls)), "cpu") {
		return fmt.Errorf("cgroup %s lacks the cpu controller: enable +cpu in its parent's cgroup.subtree_control", c.Path)
	}
	sub, err := c.readAt(0, "cgroup.subtree_control")
	if err != nil {
		return err
	}
	c.cpuEnabled = hasOpt(strings.Fields(string(sub)), "cpu")
	return c.checkDelegated()
}

func (v2) limitMilli(c *Container) (uint32, error) {
	b, err := c.readAt(0, "cpu.max")
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
	quota, _ := strconv.ParseInt(f[0], 10, 64)
	period, _ := strconv.ParseInt(f[1], 10, 64)
	return limitOf(c, quota, period)
}

// prepareSlot makes the slot threaded, then enables +cpu for the
// container's threaded children.
func (v2) prepareSlot(c *Container, s *Slot) error {
	if err := c.writeAt(0, s.name+"/cgroup.type", "threaded"); err != nil {
		return fmt.Errorf("making slot %s threaded: %w", s.Dir(), err)
	}
	return c.ensureCPU()
}

// adoptSlot makes a slot left before it became threaded threaded.
func (v2) adoptSlot(c *Container, s *Slot) error {
	b, err := c.readAt(0, s.name+"/cgroup.type")
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(b)) != "threaded" {
		if err := c.writeAt(0, s.name+"/cgroup.type", "threaded"); err != nil {
			return fmt.Errorf("making adopted slot %s threaded: %w", s.Dir(), err)
		}
	}
	return c.ensureCPU()
}

func (v2) populated(c *Container) (bool, error) {
	lines, err := c.linesAt(0, "cgroup.events")
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

// unprepare removes the +cpu in cgroup.subtree_control once no child is
// left: runtimes that re-apply the container's resources expect a plain
// domain cgroup.
func (v2) unprepare(c *Container) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.cpuEnabled {
		return nil
	}
	names, err := c.subdirs(0)
	if err != nil {
		return c.gone(err)
	}
	if len(names) > 0 {
		return nil // children left (ours or not): +cpu stays
	}
	if err := c.writeAt(0, "cgroup.subtree_control", "-cpu"); err != nil {
		return fmt.Errorf("disabling cpu in %s/cgroup.subtree_control: %w", c.Path, err)
	}
	c.cpuEnabled = false
	return nil
}

// openAcct: cpu.stat holds the usage on v2.
func (v2) openAcct(*Slot) (int, error) { return -1, nil }

// weightV2 maps a quota to cpu.weight (1..10000; 100 is one core's default).
func weightV2(milli uint32) int64 { return clamp(int64(milli+5)/10, 1, 10000) }

func (v2) writeSpec(s *Slot, spec Spec, fresh bool) error {
	old := s.spec
	if fresh || spec.QuotaMilli != old.QuotaMilli || spec.PeriodUS != old.PeriodUS || spec.Limit&LimitCap != old.Limit&LimitCap {
		quota := "max"
		if spec.Limit&LimitCap != 0 {
			quota = strconv.FormatInt(spec.QuotaUS(), 10)
		}
		if err := s.writeFile("cpu.max", quota+" "+strconv.FormatUint(uint64(spec.PeriodUS), 10)); err != nil {
			return err
		}
	}
	if fresh || spec.QuotaMilli != old.QuotaMilli || spec.Limit&LimitShare != old.Limit&LimitShare {
		w := int64(100)
		if spec.Limit&LimitShare != 0 {
			w = weightV2(spec.QuotaMilli)
		}
		if !(fresh && w == 100) {
			return s.writeFile("cpu.weight", strconv.FormatInt(w, 10))
		}
	}
	return nil
}

func (v2) readSpec(s *Slot) (Spec, error) {
	spec := Spec{}
	b, err := s.c.readAt(0, s.name+"/cpu.max")
	if err != nil {
		return spec, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return spec, fmt.Errorf("unexpected cpu.max %q in %s", b, s.Dir())
	}
	p, _ := strconv.ParseUint(f[1], 10, 32)
	spec.PeriodUS = uint32(p)
	w, err := s.readInt("cpu.weight")
	if err != nil {
		return spec, err
	}
	if f[0] != "max" {
		q, _ := strconv.ParseInt(f[0], 10, 64)
		spec.QuotaMilli = uint32(q * 1000 / int64(p))
		spec.Limit = LimitCap
		if w == weightV2(spec.QuotaMilli) && w != 100 {
			spec.Limit |= LimitShare
		}
	} else if w != 100 {
		spec.QuotaMilli, spec.Limit = uint32(w*10), LimitShare
	}
	return spec, nil
}
