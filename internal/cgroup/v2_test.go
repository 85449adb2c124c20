package cgroup_test

import (
	"strings"
	"testing"

	"github.com/cpuslot/cpuslot/test/vm"
)

// TestCgroupV2 runs this package's kernel tests (cgrouptest.Kernel) on a real cgroup v2 kernel
// (in the test VM), with and without favordynmods.
func TestCgroupV2(t *testing.T) {
	for _, opts := range []string{"", "favordynmods"} {
		t.Run("mount="+opts, func(t *testing.T) {
			r := vm.RunKernelTests(t, "github.com/cpuslot/cpuslot/internal/cgroup",
				vm.Options{MountOptions: opts})
			if opts != "" && !strings.Contains(r.Output, "favordynmods=true") {
				t.Errorf("favordynmods not detected in the guest:\n%s", r.Output)
			}
		})
	}
}
