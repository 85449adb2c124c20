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

// processStart returns a process's start time (field 22 of its stat, in
// clock ticks since boot), which with the PID identifies it uniquely.
func processStart(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: fields
	// after it are counted from the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}
