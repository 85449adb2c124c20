package agent_test

// The live-agent harness is internal/agent/agenttest; these are the child
// scenarios of this package's tests.

import (
	"testing"

	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
)

func TestMain(m *testing.M) {
	agenttest.Main(m, agenttest.Children{
		"raw":     childRaw,
		"relay":   childRelay,
		"nested":  childNested,
		"idle":    childIdle,
		"handfds": childHandFDs,
	})
}
