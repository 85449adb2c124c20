package pool

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// threadStart returns the start time (clock ticks after boot) of thread tid
// in the agent's PID namespace. A TID and its start time name one thread
// for good: a TID reused by a new thread comes with a later start time.
var threadStart = func(tid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name may contain anything; the fields follow its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("thread %d: malformed stat", tid)
	}
	f := bytes.Fields(b[i+1:])
	// starttime is field 22 of stat; f[0] is field 3 (state).
	if len(f) < 20 {
		return 0, fmt.Errorf("thread %d: malformed stat", tid)
	}
	return strconv.ParseUint(string(f[19]), 10, 64)
}
