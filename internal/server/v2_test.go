package server

import (
	"testing"

	"github.com/cpuslot/cpuslot/test/vm"
)

// TestServerOnCgroupV2 runs this package's kernel tests (cgrouptest.Kernel) on cgroup v2 (in the
// test VM), with and without favordynmods (as internal/agent's, where the attack tests were).
func TestServerOnCgroupV2(t *testing.T) {
	for _, opts := range []string{"", "favordynmods"} {
		t.Run("mount="+opts, func(t *testing.T) {
			vm.RunKernelTests(t, "github.com/cpuslot/cpuslot/internal/server", vm.Options{MountOptions: opts})
		})
	}
}
