package server

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// nspidOf returns the innermost-namespace id of thread tid of process pid
// (the last field of NSpid in its status), or 0 if it cannot be read.
func nspidOf(pid, tid int) uint32 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				return 0
			}
			n, _ := strconv.ParseUint(f[len(f)-1], 10, 32)
			return uint32(n)
		}
	}
	return 0
}

// findHostTID finds the thread of process pid whose id in the process's own
// PID namespace is nsTID.
func findHostTID(pid int, nsTID uint32) (int, error) {
	// Fast path: same PID namespace as the agent.
	if nspidOf(pid, int(nsTID)) == nsTID {
		return int(nsTID), nil
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, fmt.Errorf("listing threads of %d: %w", pid, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if nspidOf(pid, tid) == nsTID {
			return tid, nil
		}
	}
	return 0, fmt.Errorf("process %d has no thread %d", pid, nsTID)
}
