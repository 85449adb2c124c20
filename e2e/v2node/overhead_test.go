package v2node

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// overheadServedVsNot: the in-cluster overhead of a slot per invocation.
// Two pods of one spec running `probe invoke` (one empty invocation per
// HTTP request, on one worker thread, as a runtime runs them), one served
// and one not (cpuslot.dev/enabled "true" / "false"). From the node, curl
// sends requests to each pod's /invoke over one connection per round;
// rounds alternate between the pods, so load on the machine falls on both
// alike. Every answer must be 204, the served pod's invocations must run
// in slots (90 %: a loaded node may answer after the client's budget, and
// the invocation then runs without one) and the other's in none. The
// latency ratio, with slots over without, at p50 and p99, is logged, not
// asserted: the node is emulated, so only ratios mean anything.
func (f *served) overheadServedVsNot(t *testing.T) {
	ctx := f.ctx(t, 8*time.Minute)
	const s, p = "ovh-s", "ovh-p"
	const rounds, perRound = 10, 50
	spec := func(name string, disabled bool) string {
		return servedPod(servedPodSpec{name: name, prewarm: "250m=1", request: "100m", limit: "500m",
			args: `["invoke", "-quota", "250m"]`, disabled: disabled})
	}
	if _, err := f.n.Kubectl(ctx, "apply", "-f", writeManifest(t, spec(s, false)+"---\n"+spec(p, true))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.n.Kubectl(context.WithoutCancel(ctx), "delete", "pod", s, p, "--ignore-not-found", "--wait=false")
	})
	for _, pod := range []string{s, p} {
		if _, err := f.n.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/"+pod, "--timeout=5m"); err != nil {
			desc, _ := f.n.Kubectl(ctx, "describe", "pod", pod)
			t.Fatalf("%v\n%s", err, desc)
		}
	}
	scope, uid, _ := containerScope(t, ctx, f.n, "default", s)
	f.waitSlots(t, ctx, uid, scope, 1)
	ip := map[string]string{}
	for _, pod := range []string{s, p} {
		out, err := f.n.Kubectl(ctx, "get", "pod", pod, "-o", "jsonpath={.status.podIP}")
		if err != nil || out == "" {
			t.Fatalf("pod IP of %s: %v %q", pod, err, out)
		}
		ip[pod] = out
	}
	// The served pod's probe connects to the agent once its socket is
	// there: wait (at most 2 min) until an invocation runs in a slot.
	out, code, err := f.n.Exec(ctx, fmt.Sprintf(`for i in $(seq 120); do
	slot=$(curl -sS -m 30 -o /dev/null -w '%%header{x-cpuslot-slot}' http://%s:8080/invoke)
	[ -n "$slot" ] && [ "$slot" != none ] && exit 0
	sleep 1
done
echo "last answer: slot=$slot"; exit 1`, ip[s]))
	if err != nil || code != 0 {
		logs, _ := f.n.Kubectl(ctx, "logs", s, "--tail=20")
		t.Fatalf("no invocation of %s in a slot after 2 min: %v %s\n--- its log:\n%s", s, err, out, logs)
	}

	// One guest command for every round: an emulated process start is
	// slow, and it would fall between the rounds, not in the timings.
	var script strings.Builder
	for r := 0; r < rounds; r++ {
		order := []string{s, p}
		if r%2 == 1 {
			order = []string{p, s}
		}
		for _, pod := range order {
			fmt.Fprintf(&script, "curl -sS -m 30 -w '%s %%{http_code} %%{time_total} %%header{x-cpuslot-slot}\\n' 'http://%s:8080/invoke?r=%d&i=[1-%d]'\n",
				pod, ip[pod], r, perRound)
		}
	}
	script.WriteString("true\n")
	t0 := time.Now()
	out = guest(t, ctx, f.n, script.String())
	took := time.Since(t0)
	lat := map[string][]time.Duration{}
	slots := map[string]map[string]int{s: {}, p: {}}
	bad := 0
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) != 4 || (fields[0] != s && fields[0] != p) {
			t.Errorf("curl: %q", line)
			bad++
			continue
		}
		pod, status, secs, slot := fields[0], fields[1], fields[2], fields[3]
		if status != "204" {
			t.Errorf("%s answered %s", pod, status)
			bad++
			continue
		}
		v, err := strconv.ParseFloat(secs, 64)
		if err != nil {
			t.Fatalf("curl time_total %q: %v", secs, err)
		}
		lat[pod] = append(lat[pod], time.Duration(v*float64(time.Second)))
		if slot == "none" {
			slots[pod]["none"]++
		} else {
			slots[pod]["slot"]++
		}
	}
	if bad > 0 {
		t.Fatalf("%d bad answers of %d", bad, 2*rounds*perRound)
	}
	if n := len(lat[s]) + len(lat[p]); n != 2*rounds*perRound {
		t.Fatalf("%d answers, want %d", n, 2*rounds*perRound)
	}
	t.Logf("%d requests each in %v, %d rounds of %d alternating: %s in a slot %d, without %d; %s in a slot %d, without %d",
		rounds*perRound, took.Round(time.Millisecond), rounds, perRound, s, slots[s]["slot"], slots[s]["none"], p, slots[p]["slot"], slots[p]["none"])
	if slots[s]["slot"] < rounds*perRound*9/10 {
		logs, _ := f.n.Kubectl(ctx, "logs", s, "--tail=20")
		t.Errorf("%d of %d invocations of the served pod ran in a slot, want 90 %%; its log:\n%s", slots[s]["slot"], rounds*perRound, logs)
	}
	if slots[p]["slot"] != 0 {
		t.Errorf("%d invocations of the pod not served ran in a slot", slots[p]["slot"])
	}
	p50s, p50p := cluster.Percentile(lat[s], 0.5), cluster.Percentile(lat[p], 0.5)
	p99s, p99p := cluster.Percentile(lat[s], 0.99), cluster.Percentile(lat[p], 0.99)
	t.Logf("request to /invoke (node -> pod IP -> an empty invocation), with a slot / without: p50 %.2fx, p99 %.2fx (emulated node: ratios only; p50 %v / %v, p99 %v / %v)",
		float64(p50s)/float64(p50p), float64(p99s)/float64(p99p),
		p50s.Round(10*time.Microsecond), p50p.Round(10*time.Microsecond), p99s.Round(10*time.Microsecond), p99p.Round(10*time.Microsecond))
	if _, err := f.n.Kubectl(ctx, "delete", "pod", s, p, "--wait=true", "--timeout=4m"); err != nil {
		t.Error(err)
	}
}
