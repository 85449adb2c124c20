package agent_test

// The live-agent harness is internal/agent/agenttest. The tests of the
// slot protocol's server (framing, sessions, peer identity, handlers, its
// fuzzer) are in internal/server, beside it; these test the agent.

import (
	"testing"

	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
)

func TestMain(m *testing.M) {
	agenttest.Main(m, agenttest.Children{"handfds": childHandFDs, "idle": childIdle, "churn": childChurn})
}
