// Package proc reads what the agent needs from /proc to tell processes and
// threads apart over time and to name them across PID namespaces.
package proc

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// StartTime returns the start time (field 22 of /proc/<id>/stat, clock
// ticks after boot) of process or thread id in the agent's PID namespace.
// An id and its start time name one process or thread, except when the id
// is reused within the clock tick (1/100 s) its first owner started in.
func StartTime(id int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(id) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold anything, spaces and parentheses
	// too: the fields after it are counted from its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", id)
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state).
	if len(f) < 20 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", id)
	}
	return strconv.ParseUint(string(f[19]), 10, 64)
}
