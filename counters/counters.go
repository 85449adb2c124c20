// Package counters reads a slot's CPU counters from the read-only fds the
// agent passes (api/slot/v1/SPEC.md, "counter fds"). The agent and the Go
// client both use it, so it depends on nothing but golang.org/x/sys.
package counters

import (
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Usage is what a slot has consumed since it was made.
type Usage struct {
	CPUNanos         uint64
	ThrottledNanos   uint64
	Periods          uint64
	ThrottledPeriods uint64
}

// Sub returns u - v, clamping at zero (counters restart when a slot does).
func (u Usage) Sub(v Usage) Usage {
	d := func(a, b uint64) uint64 {
		if a < b {
			return 0
		}
		return a - b
	}
	return Usage{d(u.CPUNanos, v.CPUNanos), d(u.ThrottledNanos, v.ThrottledNanos), d(u.Periods, v.Periods), d(u.ThrottledPeriods, v.ThrottledPeriods)}
}

// Read reads a slot's counters from open fds: cpu.stat, and on v1
// cpuacct.usage (acct < 0 on v2).
func Read(stat, acct int) (Usage, error) {
	var buf [512]byte
	n, err := unix.Pread(stat, buf[:], 0)
	if err != nil {
		return Usage{}, err
	}
	u := Parse(buf[:n])
	if acct >= 0 {
		n, err := unix.Pread(acct, buf[:], 0)
		if err != nil {
			return Usage{}, err
		}
		u.CPUNanos, _ = strconv.ParseUint(strings.TrimSpace(string(buf[:n])), 10, 64)
	}
	return u, nil
}

// Parse parses the text of cpu.stat (v2, or v1 where the CPU time comes
// from cpuacct.usage instead).
func Parse(stat []byte) Usage {
	var u Usage
	for _, line := range strings.Split(string(stat), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		x, _ := strconv.ParseUint(v, 10, 64)
		switch k {
		case "usage_usec":
			u.CPUNanos = x * 1000
		case "nr_periods":
			u.Periods = x
		case "nr_throttled":
			u.ThrottledPeriods = x
		case "throttled_usec":
			u.ThrottledNanos = x * 1000
		case "throttled_time": // v1, in ns
			u.ThrottledNanos = x
		}
	}
	return u
}
