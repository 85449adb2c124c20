package server

import (
	"testing"

	"github.com/cpuslot/cpuslot/test/vm"
)

// TestServerOnCgroupV2 runs this package's kernel tests (cgrouptest.Kernel) on cgroup v2 (in the
// test VM).
func TestServerOnCgroupV2(t *testing.T) {
	vm.RunKernelTests(t, "github.com/cpuslot/cpuslot/internal/server", vm.Options{})
}
