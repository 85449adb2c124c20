package pool

import "github.com/cpuslot/cpuslot/internal/proc"

// threadStart returns the start time of thread tid in the agent's PID
// namespace (a variable so that tests can stand in for the kernel).
var threadStart = proc.StartTime
