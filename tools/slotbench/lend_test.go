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

// The agent's own cgroup is found on v1 (the hierarchy holding cpu) and v2.
func TestCPUCgroup(t *testing.T) {
	v1 := "12:pids:/user.slice\n4:cpu,cpuacct:/user.slice/session-3.scope\n1:name=systemd:/user.slice/session-3.scope\n"
	if got, ok := cpuCgroup(v1, 1); !ok || got != "/user.slice/session-3.scope" {
		t.Errorf("v1: %q, %v", got, ok)
	}
	if got, ok := cpuCgroup("4:cpuacct:/a\n", 1); ok {
		t.Errorf("v1 without cpu: %q", got)
	}
	if got, ok := cpuCgroup("0::/system.slice/x.service\n", 2); !ok || got != "/system.slice/x.service" {
		t.Errorf("v2: %q, %v", got, ok)
	}
}
