package server_test

// Two kinds of tests live here. Those in package server test its parts
// against a pool (oneResolver). Those in package server_test (attacks,
// the fuzzer, local leasing) run a real agent on real cgroups through
// internal/agent/agenttest and speak to it as a peer; a test binary of
// theirs re-executed is the peer process.
//
// Tests of the wire that stay in internal/agent, for they share that
// package's helpers: holdlist_test.go (TestAttackHoldList: HOLD_LIST refused and paced),
// lend_test.go (SLEEP and WAKE), hostile_pool_test.go (quotas, RECLAIM and
// action names against the pool), foreign_test.go (fds handed on).

import (
	"os"
	"testing"

	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
	"github.com/cpuslot/cpuslot/internal/server"
)

func TestMain(m *testing.M) {
	if code, ok := server.Child(); ok {
		os.Exit(code)
	}
	agenttest.Main(m, agenttest.Children{
		"raw":       childRaw,
		"relay":     childRelay,
		"nested":    childNested,
		"orphan":    childOrphan,
		"idle":      childIdle,
		"lastwords": childLastWords,
	})
}
