package agent_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
	"github.com/cpuslot/cpuslot/internal/pool"
)

func quotaSlots(sums []pool.Summary) map[uint32]int {
	m := map[uint32]int{}
	for _, s := range sums {
		for _, q := range s.Quotas {
			if q.Slots > 0 {
				m[q.QuotaMilli] += q.Slots
			}
		}
	}
	return m
}

// TestFollowsResize: the container's CPU limit changes while it is served
// (what an in-place pod resize does to its cgroup). On cgroup v2 a limit
// lowered below the 500m slot's quota: the next maintenance removes that
// slot and keeps the 250m ones; raised again: the 500m slot is pre-warmed
// anew. On v1 the kernel itself refuses a container quota below a child's
// (EINVAL): the agent must remove such slots when the pod's spec asks for
// the lower limit, before the kubelet writes it (the Kubernetes source's
// TestResizeBelowSlotQuota); a limit lowered above every slot's quota
// shrinks the budget only.
func TestFollowsResize(t *testing.T) {
	e := agenttest.NewEnv(t, 1000, nil)
	a := e.Start()
	setLimit := func(milli uint32) error {
		p, v := filepath.Join(e.H.CPURoot, e.Rel, "cpu.max"), fmt.Sprintf("%d 100000", milli*100)
		if e.H.Version == 1 {
			p, v = filepath.Join(e.H.CPURoot, e.Rel, "cpu.cfs_quota_us"), fmt.Sprint(milli*100)
		}
		return os.WriteFile(p, []byte(v), 0)
	}
	if got := fmt.Sprint(quotaSlots(a.Summaries())); got != "map[250:2 500:1]" {
		t.Fatalf("served with %s", got)
	}
	if e.H.Version == 1 {
		if err := setLimit(400); !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("v1: a container quota below its 500m slot's: %v, want EINVAL from the kernel", err)
		}
		if err := setLimit(600); err != nil {
			t.Fatal(err)
		}
		a.Maintain(time.Now())
		if b := a.Summaries()[0].BudgetMilli; b != 600 {
			t.Fatalf("v1: budget %dm after the limit went to 600m", b)
		}
		return
	}
	if err := setLimit(400); err != nil {
		t.Fatal(err)
	}
	a.Maintain(time.Now())
	sums := a.Summaries()
	if got := fmt.Sprint(quotaSlots(sums)); got != "map[250:2]" || sums[0].BudgetMilli != 400 {
		t.Fatalf("limit 400m: slots %s, budget %dm; want map[250:2], 400m", got, sums[0].BudgetMilli)
	}
	for _, s := range sums[0].Quotas {
		if s.QuotaMilli == 500 && s.Prewarm != 1 {
			t.Fatalf("prewarm forgotten: %+v", s)
		}
	}
	if err := setLimit(1000); err != nil {
		t.Fatal(err)
	}
	a.Maintain(time.Now())
	if got := fmt.Sprint(quotaSlots(a.Summaries())); got != "map[250:2 500:1]" {
		t.Fatalf("limit 1000m again: slots %s", got)
	}
	if left := len(cgroupSlots(e)); left != 3 {
		t.Fatalf("%d slot directories, want 3", left)
	}
}

func cgroupSlots(e *agenttest.Env) []string {
	var out []string
	entries, _ := os.ReadDir(filepath.Join(e.H.CPURoot, e.Rel))
	for _, d := range entries {
		if d.IsDir() && len(d.Name()) > 8 && d.Name()[:8] == "cpuslot-" {
			out = append(out, d.Name())
		}
	}
	return out
}
