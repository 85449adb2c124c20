package cgroup_test

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"golang.org/x/sys/unix"
)

func TestSlotNames(t *testing.T) {
	for name, want := range map[string]uint32{"cpuslot-1": 1, "cpuslot-4294967295": 4294967295} {
		if id, ok := cgroup.ParseSlotName(name); !ok || id != want {
			t.Errorf("%s: got %d %v", name, id, ok)
		}
	}
	for _, bad := range []string{"cpuslot-0", "cpuslot-01", "cpuslot-", "cpuslot-x", "slot-1", "cpuslot-4294967296", "cpuslot--1"} {
		if _, ok := cgroup.ParseSlotName(bad); ok {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestSpecValidate(t *testing.T) {
	ok := cgroup.Spec{QuotaMilli: 10, PeriodUS: 100000, Limit: cgroup.LimitCap}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []cgroup.Spec{
		{QuotaMilli: 0, PeriodUS: 100000, Limit: cgroup.LimitCap},
		{QuotaMilli: 9, PeriodUS: 100000, Limit: cgroup.LimitCap},
		{QuotaMilli: 250, PeriodUS: 10, Limit: cgroup.LimitCap},
		{QuotaMilli: 250, PeriodUS: 100000},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestDetect(t *testing.T) {
	h := cgrouptest.Kernel(t)
	t.Logf("detected %s", h)
	if h.Version != 1 && h.Version != 2 {
		t.Fatalf("version %d", h.Version)
	}
}

// TestSlotLifecycle creates, places, measures, retunes, adopts and removes
// slots on the real kernel.
func TestSlotLifecycle(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	if h.Version == 2 {
		cgrouptest.JoinProcess(t, h, rel)
	}
	c, err := h.Container(rel, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := cgroup.Spec{QuotaMilli: 250, PeriodUS: 100000, Limit: cgroup.LimitCap}
	s, err := c.CreateSlot(7, spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, s.Dir(), map[int]string{1: "cpu.cfs_quota_us", 2: "cpu.max"}[h.Version]); got != map[int]string{1: "25000", 2: "25000 100000"}[h.Version] {
		t.Fatalf("quota file: %q", got)
	}

	// A thread places itself by writing "0", burns CPU, and is counted.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := s.Place(0); err != nil {
		t.Fatal(err)
	}
	if got := cgrouptest.ThreadCgroup(t, h); got != rel+"/cpuslot-7" {
		t.Fatalf("thread in %s", got)
	}
	before, err := s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	// 100 ms of the thread's own CPU time (not wall time, which a loaded
	// machine stretches): the slot counts all of it, and at 25 ms per
	// 100 ms period the cap spreads it over at least 4 periods (3 allowing
	// for one slice of overrun per period).
	burnt := cgrouptest.BurnCPU(t, 100*time.Millisecond)
	after, err := s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	t.Logf("burnt %v in the 250m slot: %+v", burnt, d)
	if time.Duration(d.CPUNanos) < burnt-10*time.Millisecond || d.Periods < 3 {
		t.Fatalf("after burning %v at 250m: %+v", burnt, d)
	}

	// Retune changes the quota in place; adoption reads it back.
	spec2 := cgroup.Spec{QuotaMilli: 500, PeriodUS: 100000, Limit: cgroup.LimitBoth}
	if err := s.Retune(spec2); err != nil {
		t.Fatal(err)
	}
	s.Close()
	adopted, err := c.AdoptSlots()
	if err != nil {
		t.Fatal(err)
	}
	if len(adopted) != 1 || adopted[0].ID != 7 || adopted[0].Spec() != spec2 {
		t.Fatalf("adopted %+v", adopted)
	}

	// Removing a slot with a thread in it moves the thread out first.
	if err := adopted[0].Remove(); err != nil {
		t.Fatal(err)
	}
	if got := cgrouptest.ThreadCgroup(t, h); got != rel {
		t.Fatalf("after removal thread in %s", got)
	}
	if left := cgrouptest.Leftovers(h, rel); len(left) != 0 {
		t.Fatalf("leftovers %v", left)
	}
	if err := c.Unprepare(); err != nil {
		t.Fatal(err)
	}
}

func TestShareOnlyAdoption(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	c, err := h.Container(rel, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := cgroup.Spec{QuotaMilli: 750, PeriodUS: 100000, Limit: cgroup.LimitShare}
	s, err := c.CreateSlot(3, spec)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	adopted, err := c.AdoptSlots()
	if err != nil || len(adopted) != 1 || adopted[0].Spec() != spec {
		t.Fatalf("adopted %+v err %v", adopted, err)
	}
	if err := adopted[0].Remove(); err != nil {
		t.Fatal(err)
	}
}

// TestQuotaAboveContainerLimit: v1 refuses a child quota above the parent's.
func TestCreateFailsCleanly(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 500)
	c, err := h.Container(rel, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lim, err := c.LimitMilli(); err != nil || lim != 500 {
		t.Fatalf("limit %d %v", lim, err)
	}
	_, err = c.CreateSlot(1, cgroup.Spec{QuotaMilli: 2000, PeriodUS: 100000, Limit: cgroup.LimitCap})
	if h.Version == 1 && err == nil {
		t.Fatal("v1 accepted a quota above the container's")
	}
	if err != nil {
		if left := cgrouptest.Leftovers(h, rel); len(left) != 0 {
			t.Fatalf("failed create left %v", left)
		}
	}
}

func TestMkdirRefused(t *testing.T) {
	h := cgrouptest.Kernel(t)
	if h.Version != 2 {
		t.Skip("cgroup.max.descendants exists on v2 only")
	}
	rel := cgrouptest.NewContainer(t, h, 0)
	if err := os.WriteFile(filepath.Join(h.CPURoot, rel, "cgroup.max.descendants"), []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	c, err := h.Container(rel, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := cgroup.Spec{QuotaMilli: 100, PeriodUS: 100000, Limit: cgroup.LimitCap}
	s, err := c.CreateSlot(1, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Remove()
	if _, err := c.CreateSlot(2, spec); !errors.Is(err, cgroup.ErrLimitReached) {
		t.Fatalf("want ErrLimitReached, got %v", err)
	}
}

func readFile(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestKeptFDsBounded: slots keep their files open only within the
// node-wide budget; beyond it they open them per use, and every slot works.
func TestKeptFDsBounded(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	c, err := h.Container(rel, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	place, stat := h.SlotFDs()
	perSlot := place + stat
	h.SetKeptFDs(2 * perSlot)
	countFDs := func() int { e, _ := os.ReadDir("/proc/self/fd"); return len(e) }
	before := countFDs()
	var slots []*cgroup.Slot
	for id := uint32(1); id <= 10; id++ {
		s, err := c.CreateSlot(id, cgroup.Spec{QuotaMilli: 250, PeriodUS: 100000, Limit: cgroup.LimitCap})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Usage(); err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	if n := countFDs() - before; n > 2*perSlot {
		t.Errorf("10 used slots hold %d fds, budget %d", n, 2*perSlot)
	}
	for _, s := range slots {
		if err := s.Remove(); err != nil {
			t.Fatal(err)
		}
	}
	if n := countFDs() - before; n != 0 {
		t.Errorf("%d fds left after removing every slot", n)
	}
}

// TestSystemdUnitWithoutDelegation: on v2 a container cgroup named like a
// systemd unit (.scope, .service) is served only with the trusted.delegate
// mark systemd sets when it delegates the unit's subtree (Delegate=yes);
// without it, or with another value, Container refuses with
// ErrNotDelegated and makes nothing there. A cgroup of another name (the
// cgroupfs driver) and v1 are not checked.
func TestSystemdUnitWithoutDelegation(t *testing.T) {
	h := cgrouptest.Kernel(t)
	parent := filepath.Dir(cgrouptest.NewContainer(t, h, 0))
	mk := func(name string) (string, string) {
		rel := parent + "/" + name
		for _, r := range []string{h.CPURoot, h.AcctRoot} {
			if r == "" {
				continue
			}
			if err := os.Mkdir(filepath.Join(r, rel), 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(filepath.Join(r, rel)) })
		}
		return rel, filepath.Join(h.CPURoot, rel)
	}
	for _, name := range []string{"cri-containerd-abc.scope", "runtime.service"} {
		rel, dir := mk(name)
		c, err := h.Container(rel, nil)
		if h.Version == 1 {
			if err != nil {
				t.Fatalf("v1 %s: %v", name, err)
			}
			c.Close()
			continue
		}
		if !errors.Is(err, cgroup.ErrNotDelegated) {
			t.Fatalf("%s without trusted.delegate: %v, want ErrNotDelegated", name, err)
		}
		t.Logf("%s: %v", name, err)
		if err := unix.Setxattr(dir, "trusted.delegate", []byte("0"), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Container(rel, nil); !errors.Is(err, cgroup.ErrNotDelegated) {
			t.Fatalf("%s with trusted.delegate=0: %v, want ErrNotDelegated", name, err)
		}
		if err := unix.Setxattr(dir, "trusted.delegate", []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
		c, err = h.Container(rel, nil)
		if err != nil {
			t.Fatalf("%s delegated: %v", name, err)
		}
		c.Close()
	}
	rel, _ := mk("ctr-cgroupfs")
	c, err := h.Container(rel, nil)
	if err != nil {
		t.Fatalf("a cgroup that is no systemd unit: %v", err)
	}
	c.Close()
}

// TestRemoveBusyInOneHierarchy: on v1 with cpu and cpuacct mounted apart a
// slot is a directory in each. When only the cpu one cannot go (a thread
// re-entered it, here a cgroup inside it), Remove must say ErrBusy and try
// again later: not report the slot removed once the cpuacct directory is
// gone, which left the cpu one behind, uncounted.
func TestRemoveBusyInOneHierarchy(t *testing.T) {
	h := cgrouptest.Kernel(t)
	if h.AcctRoot == "" {
		t.Skip("one hierarchy: a slot is one directory")
	}
	rel := cgrouptest.NewContainer(t, h, 0)
	_, s := containerWithSlot(t, h, rel)
	busy := filepath.Join(h.CPURoot, rel, s.Name(), "busy")
	if err := os.Mkdir(busy, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(); !errors.Is(err, cgroup.ErrBusy) {
		t.Errorf("Remove of a slot busy in the cpu hierarchy: %v, want ErrBusy", err)
	}
	var child *cgroup.ChildCgroupError
	if err := s.Remove(); !errors.As(err, &child) || child.Slot != s.Name() || child.Child != "busy" {
		t.Errorf("Remove of a slot with a cgroup inside: %v, want it named", err)
	}
	if _, err := os.Stat(filepath.Join(h.CPURoot, rel, s.Name())); err != nil {
		t.Fatalf("the busy slot's cpu directory: %v", err)
	}
	if err := s.Remove(); !errors.Is(err, cgroup.ErrBusy) {
		t.Errorf("Remove again, its cpuacct directory gone: %v, want ErrBusy", err)
	}
	if err := os.Remove(busy); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(); err != nil {
		t.Errorf("Remove once no longer busy: %v", err)
	}
	for _, root := range []string{h.CPURoot, h.AcctRoot} {
		if _, err := os.Stat(filepath.Join(root, rel, s.Name())); !os.IsNotExist(err) {
			t.Errorf("%s: the slot's directory is still there (%v)", root, err)
		}
	}
}
