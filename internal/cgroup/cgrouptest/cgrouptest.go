// Package cgrouptest makes throwaway container cgroups for integration
// tests on the real kernel (the host's cgroup v1, or cgroup v2 inside the
// test VM) and removes them, and everything under them, afterwards.
package cgrouptest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/internal/cgroup"
)

// Kernel marks a test as a kernel test and returns the cpu hierarchy,
// skipping the test when not root. Every test that works on the real
// kernel's cgroups gets its hierarchy here, directly or through a helper of
// its package: the package's cgroup v2 run (vm.RunKernelTests) finds the
// tests that reach this call in the source and runs each of them in the
// VM, so a new kernel test runs on both kernels without being listed.
func Kernel(t testing.TB) *cgroup.Hierarchy {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	h, err := cgroup.Detect()
	if err != nil {
		t.Skipf("no cpu cgroup hierarchy: %v", err)
	}
	return h
}

var seq atomic.Int64

// NewContainer creates /cpuslot-test-<pid>-<n>/ctr (in every hierarchy the
// cpu controller spans) and returns its path relative to the hierarchy
// root. limitMilli > 0 gives the container a CPU limit, as a pod's limit
// would. Everything is removed when the test ends.
func NewContainer(t testing.TB, h *cgroup.Hierarchy, limitMilli uint32) string {
	t.Helper()
	parent := fmt.Sprintf("/cpuslot-test-%d-%d", os.Getpid(), seq.Add(1))
	rel := parent + "/ctr"
	roots := []string{h.CPURoot}
	if h.AcctRoot != "" {
		roots = append(roots, h.AcctRoot)
	}
	t.Cleanup(func() {
		// A process of the test that is still exiting (an orphan whose
		// stdin just closed) cannot be moved out, and keeps its cgroup
		// busy until its exit is through: retry until then.
		if err := h.RemoveTree(parent, cgroup.TreeOptions{Wait: time.Minute}); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	for _, r := range roots {
		if err := os.MkdirAll(filepath.Join(r, rel), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.DelegateCPU(parent); err != nil {
		t.Fatal(err)
	}
	if limitMilli > 0 {
		if err := h.SetLimit(rel, limitMilli); err != nil {
			t.Fatal(err)
		}
	}
	return rel
}

// JoinProcess moves the whole test process into the container (needed on
// v2, where a thread can only enter slots of its own threaded subtree) and
// moves it back to the root when the test ends.
func JoinProcess(t testing.TB, h *cgroup.Hierarchy, rel string) {
	t.Helper()
	pid := strconv.Itoa(os.Getpid())
	roots := []string{h.CPURoot}
	if h.AcctRoot != "" {
		roots = append(roots, h.AcctRoot)
	}
	for _, r := range roots {
		write(t, filepath.Join(r, rel, "cgroup.procs"), pid)
	}
	t.Cleanup(func() {
		for _, r := range roots {
			_ = os.WriteFile(filepath.Join(r, "cgroup.procs"), []byte(pid), 0)
		}
	})
}

func write(t testing.TB, path, v string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(v), 0); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

// ThreadCgroup returns the cpu cgroup path of the calling OS thread.
func ThreadCgroup(t testing.TB, h *cgroup.Hierarchy) string {
	t.Helper()
	p, err := h.PathOfThread(os.Getpid(), syscall.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Leftovers lists slot directories under the test containers of this
// process: a test that leaks one fails.
func Leftovers(h *cgroup.Hierarchy, rel string) []string {
	var left []string
	entries, _ := os.ReadDir(filepath.Join(h.CPURoot, rel))
	for _, e := range entries {
		if _, ok := cgroup.ParseSlotName(e.Name()); ok {
			left = append(left, e.Name())
		}
	}
	return left
}

// ThreadCPU is the CPU time the calling OS thread has used, from the same
// kernel accounting (the scheduler's runtime) that cgroup CPU counters sum.
// Tests compare slot counters with it instead of with wall time, which a
// loaded or emulated machine stretches. The caller must be locked to its
// OS thread.
func ThreadCPU(t testing.TB) time.Duration {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

// BurnCPU spins the calling OS thread until it has used d of CPU time
// (not wall time: on a busy machine that takes longer) and returns what
// it used.
func BurnCPU(t testing.TB, d time.Duration) time.Duration {
	t.Helper()
	start := ThreadCPU(t)
	for {
		if used := ThreadCPU(t) - start; used >= d {
			return used
		}
	}
}
