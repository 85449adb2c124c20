package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// v1 is cgroup v1: cpu (and cpuacct, perhaps mounted apart) each in a
// hierarchy of its own, any thread movable alone through tasks, and a
// placement fd that moves any thread its holder can name (foreign.go).
type v1 struct{}

func (v1) describe(h *Hierarchy) string {
	var keys []string
	for _, w := range h.Witnesses {
		keys = append(keys, w.Key)
	}
	witnesses := ", witness hierarchies: " + strings.Join(keys, ",")
	if len(keys) == 0 {
		witnesses = ", no witness hierarchy"
	}
	if h.AcctRoot != "" {
		return fmt.Sprintf("cgroup v1: cpu at %s, cpuacct at %s%s", h.CPURoot, h.AcctRoot, witnesses)
	}
	return fmt.Sprintf("cgroup v1: cpu,cpuacct at %s%s", h.CPURoot, witnesses)
}

func (v1) cpuKey() string      { return "cpu" }
func (v1) threadsFile() string { return "tasks" }
func (v1) confinesFDs() bool   { return false }

func (v1) slotFDs(h *Hierarchy) (place, stat int) { return len(h.dirs("/")), 2 }

// startIn moves the child right after start: a child that must not run
// outside the cgroup should wait for a word on stdin from the caller.
func (v1) startIn(h *Hierarchy, cmd *exec.Cmd, rel string) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := h.MoveProcess(cmd.Process.Pid, rel); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	return nil
}

// delegateCPU: every cgroup of the cpu hierarchy has the controller.
func (v1) delegateCPU(*Hierarchy, string) error { return nil }

func (v1) setLimit(h *Hierarchy, rel string, milli uint32) error {
	return os.WriteFile(filepath.Join(h.CPURoot, rel, "cpu.cfs_quota_us"), []byte(strconv.Itoa(int(milli)*100)), 0)
}

func (v1) openContainer(c *Container) error {
	c.witness = c.h.witnessOf(c.Path)
	return nil
}

func (v1) limitMilli(c *Container) (uint32, error) {
	quota, err := c.readInt("cpu.cfs_quota_us")
	if err != nil {
		return 0, err
	}
	if quota < 0 {
		return 0, nil
	}
	period, err := c.readInt("cpu.cfs_period_us")
	if err != nil {
		return 0, err
	}
	return limitOf(c, quota, period)
}

func (v1) prepareSlot(*Container, *Slot) error { return nil }
func (v1) adoptSlot(*Container, *Slot) error   { return nil }
func (v1) unprepare(*Container) error          { return nil }

func (v1) populated(c *Container) (bool, error) { return c.populatedV1(".", 0) }

func (c *Container) populatedV1(rel string, depth int) (bool, error) {
	lines, err := c.linesAt(0, rel+"/tasks")
	if err != nil || len(lines) > 0 {
		return len(lines) > 0, err
	}
	if depth >= maxWalkDepth {
		return false, fmt.Errorf("cgroup %s/%s: deeper than %d levels", c.Path, rel, maxWalkDepth)
	}
	names, err := c.subdirsOf(0, rel)
	if err != nil {
		return false, err
	}
	for _, n := range names {
		if found, err := c.populatedV1(rel+"/"+n, depth+1); found || err != nil {
			return found, err
		}
	}
	return false, nil
}

// openAcct opens cpuacct.usage in the cpuacct dir, or the joint
// cpu,cpuacct one.
func (v1) openAcct(s *Slot) (int, error) {
	return s.c.openAt(len(s.c.dirs)-1, s.name+"/cpuacct.usage", unix.O_RDONLY)
}

// sharesV1 maps a quota to cpu.shares (1024 per core).
func sharesV1(milli uint32) int64 { return clamp((int64(milli)*1024+500)/1000, 2, 262144) }

func (v1) writeSpec(s *Slot, spec Spec, fresh bool) error {
	old := s.spec
	if fresh || spec.PeriodUS != old.PeriodUS {
		// A shorter period with the old quota in place could exceed the
		// parent's ratio: drop the quota first.
		if !fresh {
			if err := s.writeFile("cpu.cfs_quota_us", "-1"); err != nil {
				return err
			}
			old.Limit &^= LimitCap
		}
		if err := s.writeFile("cpu.cfs_period_us", strconv.FormatUint(uint64(spec.PeriodUS), 10)); err != nil {
			return err
		}
	}
	if fresh || spec.QuotaMilli != old.QuotaMilli || spec.Limit&LimitCap != old.Limit&LimitCap || spec.PeriodUS != old.PeriodUS {
		quota := int64(-1)
		if spec.Limit&LimitCap != 0 {
			quota = spec.QuotaUS()
		}
		if !(fresh && quota == -1) {
			if err := s.writeFile("cpu.cfs_quota_us", strconv.FormatInt(quota, 10)); err != nil {
				return err
			}
		}
	}
	if fresh || spec.QuotaMilli != old.QuotaMilli || spec.Limit&LimitShare != old.Limit&LimitShare {
		sh := int64(1024)
		if spec.Limit&LimitShare != 0 {
			sh = sharesV1(spec.QuotaMilli)
		}
		if !(fresh && sh == 1024) {
			return s.writeFile("cpu.shares", strconv.FormatInt(sh, 10))
		}
	}
	return nil
}

func (v1) readSpec(s *Slot) (Spec, error) {
	spec := Spec{}
	q, err := s.readInt("cpu.cfs_quota_us")
	if err != nil {
		return spec, err
	}
	p, err := s.readInt("cpu.cfs_period_us")
	if err != nil {
		return spec, err
	}
	sh, err := s.readInt("cpu.shares")
	if err != nil {
		return spec, err
	}
	spec.PeriodUS = uint32(p)
	if q > 0 {
		spec.QuotaMilli = uint32(q * 1000 / p)
		spec.Limit = LimitCap
		if sh == sharesV1(spec.QuotaMilli) && sh != 1024 {
			spec.Limit |= LimitShare
		}
	} else if sh != 1024 {
		spec.QuotaMilli = uint32((sh*1000 + 512) / 1024)
		spec.Limit = LimitShare
	}
	return spec, nil
}
