// Package proc reads what the agent needs from /proc to tell processes and
// threads apart over time and to name them across PID namespaces.
package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// StartTime returns the start time (field 22 of /proc/<id>/stat, clock
// ticks after boot) of process or thread id in the agent's PID namespace.
// An id and its start time name one process or thread, except when the id
// is reused within the clock tick (1/100 s) its first owner started in.
func StartTime(id int) (uint64, error) {
	f, err := statFields(id)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(string(f[19]), 10, 64)
}

// errMalformed: a stat file without the fields the kernel writes.
var errMalformed = errors.New("malformed")

// statFields returns the fields of /proc/<id>/stat from field 3 (state)
// on, at least 20 of them. The command name (field 2) may hold anything,
// spaces and parentheses too: the fields after it are counted from its last
// ')'.
func statFields(id int) ([][]byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(id) + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: %w", id, errMalformed)
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state).
	if len(f) < 20 {
		return nil, fmt.Errorf("/proc/%d/stat: %w", id, errMalformed)
	}
	return f, nil
}

// pfExiting is the kernel's PF_EXITING task flag (field 9 of stat).
const pfExiting = 0x4

// Exiting reports whether thread id (in the agent's PID namespace) is gone
// or on its way out: a zombie or dead state, or PF_EXITING set. The kernel
// moves no exiting thread between cgroups, and such a thread leaves its
// cgroup within moments.
func Exiting(id int) bool {
	f, err := statFields(id)
	if err != nil {
		return !errors.Is(err, errMalformed) // unreadable: gone
	}
	if s := f[0]; len(s) == 1 && (s[0] == 'Z' || s[0] == 'X' || s[0] == 'x') {
		return true
	}
	flags, err := strconv.ParseUint(string(f[6]), 10, 64)
	return err == nil && flags&pfExiting != 0
}
