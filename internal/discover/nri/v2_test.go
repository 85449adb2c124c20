package nri

import (
	"testing"

	"github.com/cpuslot/cpuslot/test/vm"
)

// TestNRIOnCgroupV2 runs this package's kernel tests (cgrouptest.Kernel)
// on cgroup v2 (in the test VM): the plugin driven by NRI's runtime
// library as containerd or CRI-O would, on the current nodes' hierarchy.
func TestNRIOnCgroupV2(t *testing.T) {
	vm.RunKernelTests(t, "github.com/cpuslot/cpuslot/internal/discover/nri", vm.Options{})
}
