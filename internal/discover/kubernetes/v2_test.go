package kubernetes

import (
	"testing"

	"github.com/cpuslot/cpuslot/test/vm"
)

// TestKubernetesOnCgroupV2 runs this package's kernel tests
// (cgrouptest.Kernel) on cgroup v2 (in the test VM).
func TestKubernetesOnCgroupV2(t *testing.T) {
	vm.RunKernelTests(t, "github.com/cpuslot/cpuslot/internal/discover/kubernetes", vm.Options{})
}
