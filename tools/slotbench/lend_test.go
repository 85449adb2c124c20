package main

import (
	"runtime"
	"testing"
)

// The lend client gives every worker thread a P and one more, and never
// lowers GOMAXPROCS.
func TestProcsForWorkers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(2)
	procsForWorkers(8)
	if got := runtime.GOMAXPROCS(0); got != 9 {
		t.Fatalf("GOMAXPROCS %d for 8 workers, want 9", got)
	}
	procsForWorkers(3)
	if got := runtime.GOMAXPROCS(0); got != 9 {
		t.Fatalf("GOMAXPROCS lowered to %d for 3 workers, want 9 kept", got)
	}
}

// The container's throttling is read from cpu.stat as v1 and v2 write it.
func TestParseThrottling(t *testing.T) {
	for name, stat := range map[string]string{
		"v1": "nr_periods 120\nnr_throttled 45\nthrottled_time 2100000000\nnr_bursts 0\nburst_time 0\n",
		"v2": "usage_usec 9000\nuser_usec 8000\nsystem_usec 1000\nnr_periods 120\nnr_throttled 45\nthrottled_usec 2100000\n",
	} {
		if p, th := parseThrottling([]byte(stat)); p != 120 || th != 45 {
			t.Errorf("%s: periods %d, throttled %d, want 120, 45", name, p, th)
		}
	}
	if p, th := parseThrottling(nil); p != 0 || th != 0 {
		t.Errorf("no cpu.stat: %d, %d, want 0, 0", p, th)
	}
}
