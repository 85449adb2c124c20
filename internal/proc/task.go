package proc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Threads lists the thread ids of process pid (its /proc/<pid>/task).
func Threads(pid int) ([]int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(tasks))
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		tids = append(tids, tid)
	}
	return tids, nil
}

// IsThreadOf reports whether tid is a thread of process pid.
func IsThreadOf(pid, tid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d", pid, tid))
	return err == nil
}

// NSpid returns the innermost-namespace id of thread tid of process pid
// (the last field of NSpid in its status), or 0 if it cannot be read.
func NSpid(pid, tid int) uint32 {
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

// FindHostTID finds the thread of process pid whose id in the process's own
// PID namespace is nsTID, and returns its id in the agent's.
func FindHostTID(pid int, nsTID uint32) (int, error) {
	// Fast path: same PID namespace as the agent.
	if NSpid(pid, int(nsTID)) == nsTID {
		return int(nsTID), nil
	}
	tids, err := Threads(pid)
	if err != nil {
		return 0, fmt.Errorf("listing threads of %d: %w", pid, err)
	}
	for _, tid := range tids {
		if NSpid(pid, tid) == nsTID {
			return tid, nil
		}
	}
	return 0, fmt.Errorf("process %d has no thread %d", pid, nsTID)
}
