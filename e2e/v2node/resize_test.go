package v2node

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// resize: an in-place CPU resize of fn (the pod's resize subresource) while
// its slots exist. Shrinking the limit (1 -> 400m) below the 500m slot's
// quota: the kubelet changes the scope's cpu.max without restarting the
// container; the agent removes the 500m slot, keeps the 250m ones, refuses
// 500m (INVALID_QUOTA) and says so in a CpuslotResized Event; fn's process
// gives back one of its two held 250m slots, so the pool's granted total
// comes within the new 400m budget; invocations at 250m go on, none fails.
// Growing back (400m -> 1): the 500m slot is pre-warmed again and 500m is
// granted.
func (f *served) resize(t *testing.T) {
	ctx := f.ctx(t, 10*time.Minute)
	before, st0 := f.slots(t, ctx, f.scope), f.stats(t, ctx)
	t.Logf("slots before: %v", before)

	// The pre-warmed set is three 250m slots and one 500m; a 250m slot
	// grown by an earlier step may be there too, until it idles out.
	shrunk := f.resizeTo(t, ctx, "300m", "400m", "40000 100000")
	var slots map[string]string
	atLimit := func() bool {
		c := quotaCounts(slots)
		return c["50000 100000"] == 0 && c["25000 100000"] >= 3 && len(c) == 1
	}
	for start := time.Now(); ; time.Sleep(time.Second) {
		slots = f.slots(t, ctx, f.scope)
		if atLimit() || time.Since(start) > 2*time.Minute {
			break
		}
	}
	t.Logf("limit 400m: slots %v, %v after the resize was applied", slots, time.Since(shrunk).Round(time.Millisecond))
	if !atLimit() {
		t.Errorf("after the limit went to 400m: slots by cpu.max %v, want the 500m slot removed, the 250m ones kept", quotaCounts(slots))
	}
	for name, s := range slots {
		if before[name] != s {
			t.Errorf("slot %s is %q after the shrink, was %q (want the 250m slots kept as they were)", name, s, before[name])
		}
	}
	if _, out, err := f.probeQuota(t, ctx, f.pod, "500m", "100ms"); err == nil || !strings.Contains(out, "INVALID_QUOTA") {
		t.Errorf("asking 500m under a 400m limit: %v: %q, want INVALID_QUOTA", err, lastLine(out))
	} else {
		_, refusal, _ := strings.Cut(out, "INVALID_QUOTA")
		refusal, _, _ = strings.Cut(refusal, "\n")
		t.Logf("asking 500m under a 400m limit: INVALID_QUOTA%s", refusal)
	}
	// fn's process held two 250m slots (local leasing) across the shrink:
	// 500m granted against a 400m budget. It asks the agent once a second
	// what to give back (HOLD_LIST) and gives a held slot back, a busy one once
	// its invocation ends: the granted total comes within 400m while fn
	// keeps invoking.
	var use poolUse
	for start := time.Now(); ; time.Sleep(time.Second) {
		use = f.poolUse(t, ctx, "default/"+f.pod+"/")
		if use.BudgetMilli == 400 && use.UsedMilli <= 400 {
			t.Logf("granted %dm of the 400m budget %v after the shrink was applied", use.UsedMilli, time.Since(shrunk).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 2*time.Minute {
			t.Errorf("2 min after the shrink fn's pool grants %dm of a %dm budget, want within 400m (held slots given back)", use.UsedMilli, use.BudgetMilli)
			break
		}
	}
	// Another process asking now may get 250m or wait for budget (fn may
	// hold 250m and be asking for its second thread): shown, not checked.
	if r, out, err := f.probeQuota(t, ctx, f.pod, "250m", "200ms"); err != nil {
		why := lastLine(out)
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "acquire:") {
				why = line
			}
		}
		t.Logf("another process asking 250m under a 400m limit after the give-back: %s", why)
	} else {
		t.Logf("another process asking 250m under a 400m limit after the give-back: granted %dm", r.QuotaMilli)
	}
	f.waitEvent(t, ctx, "CpuslotResized", "from 1 to 400m")
	st1 := f.stats(t, ctx)
	// Two threads at 250m no longer fit a 400m budget at once: one may
	// wait, or run without a slot when its wait budget ends (counted, not
	// failed).
	t.Logf("while at 400m: %d invocations in a slot, %d without, %d failed", st1.OK-st0.OK, st1.Unslotted-st0.Unslotted, st1.Failed-st0.Failed)
	if st1.OK <= st0.OK || st1.Failed != st0.Failed {
		t.Errorf("invocations across the shrink: %d in a slot, %d failed: %v", st1.OK-st0.OK, st1.Failed-st0.Failed, st1.Errors)
	}

	grown := f.resizeTo(t, ctx, "500m", "1", "100000 100000")
	grownBack := func() bool {
		c := quotaCounts(slots)
		return c["50000 100000"] == 1 && c["25000 100000"] >= 3 && len(c) == 2
	}
	for start := time.Now(); ; time.Sleep(time.Second) {
		slots = f.slots(t, ctx, f.scope)
		if grownBack() || time.Since(start) > 2*time.Minute {
			break
		}
	}
	t.Logf("limit 1: slots %v, %v after the resize was applied", slots, time.Since(grown).Round(time.Millisecond))
	if !grownBack() {
		t.Errorf("after the limit went back to 1: slots by cpu.max %v, want the 500m slot pre-warmed again beside the 250m ones", quotaCounts(slots))
	}
	if r, out, err := f.probeQuota(t, ctx, f.pod, "500m", "200ms"); err != nil || r.QuotaMilli != 500 {
		t.Errorf("asking 500m under a limit of 1 again: %v: %s", err, lastLine(out))
	}
	f.waitEvent(t, ctx, "CpuslotResized", "from 400m to 1")
	st2 := f.stats(t, ctx)
	checkLoad(t, st1, st2, false)
}

// resizeTo patches fn's CPU request and limit through the resize
// subresource and waits until the kubelet reports them applied and the
// scope's cpu.max is cpuMax; it returns when that was seen.
func (f *served) resizeTo(t *testing.T, ctx context.Context, request, limit, cpuMax string) time.Time {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":"fn","resources":{"requests":{"cpu":%q},"limits":{"cpu":%q}}}]}}`, request, limit)
	t0 := time.Now()
	if out, err := f.n.Kubectl(ctx, "patch", "pod", f.pod, "--subresource", "resize", "--type", "strategic", "-p", patch); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var status, max string
	for {
		status, _ = f.n.Kubectl(ctx, "get", "pod", f.pod, "-o",
			`jsonpath={.status.containerStatuses[0].resources.limits.cpu} {.status.containerStatuses[0].containerID} {range .status.conditions[*]}{.type}={.status}:{.reason} {end}`)
		max = guest(t, ctx, f.n, "cat "+f.scope+"/cpu.max")
		if strings.HasPrefix(status, limit+" ") && !strings.Contains(status, "PodResize") && max == cpuMax {
			break
		}
		if time.Since(t0) > 3*time.Minute {
			desc, _ := f.n.Kubectl(ctx, "describe", "pod", f.pod)
			t.Fatalf("resize to limit %s not applied 3 min after the patch: status %q, scope cpu.max %q\n%s", limit, status, max, desc)
		}
		time.Sleep(time.Second)
	}
	if !strings.Contains(status, f.id) {
		t.Errorf("the resize restarted the container: %q, was %s", status, f.id)
	}
	t.Logf("resize to request %s, limit %s: applied %v after the patch (scope cpu.max %s)", request, limit, time.Since(t0).Round(time.Millisecond), max)
	return time.Now()
}

// waitEvent waits (at most 2 minutes) for an Event of fn with reason whose
// message contains text.
func (f *served) waitEvent(t *testing.T, ctx context.Context, reason, text string) {
	t.Helper()
	var msgs string
	for start := time.Now(); time.Since(start) < 2*time.Minute; time.Sleep(2 * time.Second) {
		msgs, _ = f.n.Kubectl(ctx, "get", "events", "--field-selector", "involvedObject.name="+f.pod+",reason="+reason,
			"-o", "jsonpath={range .items[*]}{.type} {.message}{\"\\n\"}{end}")
		for _, line := range strings.Split(msgs, "\n") {
			if strings.Contains(line, text) {
				t.Logf("event %s: %s", reason, line)
				return
			}
		}
	}
	t.Errorf("no %s event of %s naming %s: %q", reason, f.pod, text, msgs)
}

// quotaCounts counts slots by cpu.max.
func quotaCounts(slots map[string]string) map[string]int {
	m := map[string]int{}
	for _, s := range slots {
		f := strings.Fields(s)
		if len(f) >= 2 {
			m[f[0]+" "+f[1]]++
		}
	}
	return m
}

// poolUse reads the agent's pool whose name starts with prefix.
func (f *served) poolUse(t *testing.T, ctx context.Context, prefix string) poolUse {
	t.Helper()
	pools := f.debugPools(t, ctx)
	for _, x := range pools {
		if strings.HasPrefix(x.Name, prefix) {
			return x
		}
	}
	t.Fatalf("no pool named %s* in /debug/pools: %+v", prefix, pools)
	return poolUse{}
}
