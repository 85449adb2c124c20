package pool

import (
	"testing"

	"github.com/cpuslot/cpuslot/test/vm"
)

// TestPoolOnCgroupV2 runs this package's kernel tests (cgrouptest.Kernel) on cgroup v2 (in the
// test VM).
func TestPoolOnCgroupV2(t *testing.T) {
	vm.RunKernelTests(t, "github.com/cpuslot/cpuslot/internal/pool", vm.Options{})
}
