package v2node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// podSlice is the systemd slice cgroup (a guest path) of a Burstable pod.
func podSlice(uid string) string { return podSlicePath(uid, "Burstable") }

// podUID is a pod's UID, known as soon as it is created.
func (f *served) podUID(t *testing.T, ctx context.Context, pod string) string {
	t.Helper()
	uid, err := f.n.Kubectl(ctx, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}")
	if err != nil || uid == "" {
		t.Fatalf("uid of %s: %v %q", pod, err, uid)
	}
	return uid
}

// noSlotOutside fails the test for any cpuslot cgroup that is not in one
// of the scopes named (the served containers the test still runs).
// The agent removes a deleted pod's slots once it has seen the deletion:
// wait for that, at most 2 minutes.
func (f *served) noSlotOutside(t *testing.T, ctx context.Context, scopes ...string) {
	t.Helper()
	var outside []string
	for start := time.Now(); ; time.Sleep(time.Second) {
		outside = nil
		out := guest(t, ctx, f.n, "find /sys/fs/cgroup/kubepods.slice -type d -name 'cpuslot-*'")
		for _, p := range strings.Fields(out) {
			if !slices.Contains(scopes, filepath.Dir(p)) {
				outside = append(outside, p)
			}
		}
		if len(outside) == 0 || time.Since(start) > 2*time.Minute {
			break
		}
	}
	if len(outside) > 0 {
		t.Errorf("cpuslot cgroups outside the served containers' scopes 2 min on: %s", strings.Join(outside, " "))
	}
}

// podEvents is one pod's Events from cpuslot, one line each.
func (f *served) podEvents(t *testing.T, ctx context.Context, pod string) string {
	t.Helper()
	out, _ := f.n.Kubectl(ctx, "get", "events", "--field-selector", "involvedObject.name="+pod, "-o",
		`jsonpath={range .items[?(@.source.component=="cpuslot-node-agent")]}{.type} {.reason} x{.count}: {.message}{"\n"}{end}`)
	return strings.TrimSpace(out)
}

// agentLog is the agent's log lines that mention text.
func (f *served) agentLog(t *testing.T, ctx context.Context, text string) string {
	t.Helper()
	out, _ := f.n.Kubectl(ctx, "-n", f.ns, "logs", f.agentPod(t, ctx), "--tail=400")
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, text) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// wantServedAtStart checks that the agent's NRI plugin served each named
// container (namespace/pod/container) at its start. A start the plugin
// let go on without its pool (nri.startTimeout passed: fail-open, logged
// and counted) is logged, not failed: the emulated node may be that slow,
// and the runtime's readiness covers it.
func (f *served) wantServedAtStart(t *testing.T, ctx context.Context, names ...string) {
	t.Helper()
	out, _ := f.n.Kubectl(ctx, "-n", f.ns, "logs", f.agentPod(t, ctx), "--tail=-1")
	for _, name := range names {
		served, failOpen := "", ""
		for _, l := range strings.Split(out, "\n") {
			switch {
			case !strings.Contains(l, name):
			case strings.Contains(l, "served before the container's start"):
				served = l
			case strings.Contains(l, "nri.startTimeout"):
				failOpen = l
			}
		}
		switch {
		case served != "":
			t.Logf("NRI: %s", served)
		case failOpen != "":
			t.Logf("NRI failed open on %s (the node was slower than nri.startTimeout): %s", name, failOpen)
		default:
			t.Errorf("the agent's log does not show %s served at its container's start through NRI\n%s", name, f.agentLog(t, ctx, "nri"))
		}
	}
}

// deletedWhilePreparing: a served pod that pre-warms many slots is deleted
// (through the API, from the guest, at once) as soon as its first slot
// appears, while the agent still makes the rest. Its pod slice goes, no
// cpuslot cgroup is left anywhere but in the served pods' scopes, and the
// agent has no pool for it.
func (f *served) deletedWhilePreparing(t *testing.T) {
	ctx := f.ctx(t, 8*time.Minute)
	const pod, prewarm, want = "prep", "100m=60", 60
	if _, err := f.n.Kubectl(ctx, "apply", "-f", writeManifest(t, servedPod(servedPodSpec{
		name: pod, prewarm: prewarm, request: "100m", limit: "1", args: `["serve"]`,
	}))); err != nil {
		t.Fatal(err)
	}
	defer f.n.Kubectl(context.WithoutCancel(ctx), "delete", "pod", pod, "--ignore-not-found", "--wait=false")
	uid := f.podUID(t, ctx, pod)
	slice := podSlice(uid)
	pki := filepath.Join(f.n.dir, "pki")
	// In the guest: wait for the first slot, delete the pod through the API
	// at once (curl: a kubectl would take seconds to start emulated), and
	// count the slots then and a moment later.
	// The wait spins on shell builtins (no fork per round: the emulated
	// guest forks slowly), bounded by SECONDS.
	out, code, err := f.n.Exec(ctx, fmt.Sprintf(`count() { ls -d %[1]s/cri-containerd-*.scope/cpuslot-* 2>/dev/null | wc -l; }
found=
while [ -z "$found" ] && [ $SECONDS -lt 300 ]; do
	for d in %[1]s/cri-containerd-*.scope/cpuslot-*; do [ -d "$d" ] && found=1 && break; done
done
[ -n "$found" ] || { echo "no slot within 300 s"; exit 1; }
n=$(count)
code=$(curl -sS -o /dev/null -w '%%{http_code}' --cacert %[2]s/ca.crt --cert %[2]s/admin.crt --key %[2]s/admin.key \
	-X DELETE https://127.0.0.1:%[3]d/api/v1/namespaces/default/pods/%[4]s)
echo "$n $(count) $code"`, slice, pki, apiPort, pod))
	if err != nil || code != 0 {
		t.Fatalf("%v: %s", err, out)
	}
	var atDelete, after int
	var httpCode string
	if _, err := fmt.Sscan(lastLine(out), &atDelete, &after, &httpCode); err != nil || httpCode != "200" {
		t.Fatalf("guest: %q (%v)", out, err)
	}
	if atDelete < want {
		t.Logf("%s deleted with %d of its %d slots made (%d just after the delete)", pod, atDelete, want, after)
	} else {
		t.Logf("%s deleted after all %d slots were made: the preparation was quicker than the delete this time", pod, want)
	}
	t0 := time.Now()
	if _, err := f.n.Kubectl(ctx, "wait", "--for=delete", "pod/"+pod, "--timeout=4m"); err != nil {
		t.Fatal(err)
	}
	// The kubelet removes the slice once the container's scope is gone; a
	// scope whose slots outlived its container goes at its later
	// housekeeping (106 s once here): SliceGone checks it after the other
	// steps, not waiting here.
	f.prep.slice, f.prep.gone = slice, t0
	f.noSlotOutside(t, ctx, f.scope)
	var pools []string
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(time.Second) {
		if pools = f.pools(t, ctx); !slices.ContainsFunc(pools, func(p string) bool { return strings.HasPrefix(p, "default/"+pod+"/") }) {
			break
		}
	}
	if slices.ContainsFunc(pools, func(p string) bool { return strings.HasPrefix(p, "default/"+pod+"/") }) {
		t.Errorf("the agent still has a pool for the deleted pod: %v", pools)
	}
	t.Logf("agent log on %s:\n%s", pod, f.agentLog(t, ctx, pod))
}

// sliceGone: the slice of DeletedWhilePreparing's pod is gone (checked
// last, as the kubelet may take minutes), and no cpuslot cgroup is left
// outside the served pod's scope.
func (f *served) sliceGone(t *testing.T) {
	if f.prep.slice == "" {
		t.Skip("DeletedWhilePreparing made no pod")
	}
	ctx := f.ctx(t, 6*time.Minute)
	if out, code, err := f.n.Exec(ctx, fmt.Sprintf(`for i in $(seq 300); do
	[ ! -e %[1]s ] && exit 0
	sleep 1
done
find %[1]s; exit 1`, f.prep.slice)); err != nil || code != 0 {
		t.Errorf("the deleted pod's slice is still there %v after it was gone from the API: %v\n%s", time.Since(f.prep.gone).Round(time.Second), err, out)
	} else {
		t.Logf("the deleted pod's slice gone (seen %v after the pod left the API)", time.Since(f.prep.gone).Round(time.Second))
	}
	f.noSlotOutside(t, ctx, f.scope)
}

// containerdRestartMidPrepare: containerd restarts as a served pod's
// container starts (when its scope appears), before the agent has asked
// containerd where the container is. The pod runs, and the agent serves it
// once containerd answers again: exactly its pre-warmed slots, in the scope
// of the container that runs then, none elsewhere; what failed meanwhile
// is a Warning Event naming containerd.
func (f *served) containerdRestartMidPrepare(t *testing.T) {
	ctx := f.ctx(t, 10*time.Minute)
	const pod = "ctrd"
	if _, err := f.n.Kubectl(ctx, "apply", "-f", writeManifest(t, servedPod(servedPodSpec{
		name: pod, prewarm: "250m=2", request: "100m", limit: "1", args: `["serve"]`,
	}))); err != nil {
		t.Fatal(err)
	}
	defer f.n.Kubectl(context.WithoutCancel(ctx), "delete", "pod", pod, "--ignore-not-found", "--wait=false")
	uid := f.podUID(t, ctx, pod)
	// The sandbox's scope comes first, the container's second.
	out, code, err := f.n.Exec(ctx, fmt.Sprintf(`for i in $(seq 3000); do
	[ "$(ls -d %[1]s/cri-containerd-*.scope 2>/dev/null | wc -l)" -ge 2 ] && break
	sleep 0.05
done
echo "scopes: $(ls -d %[1]s/cri-containerd-*.scope 2>/dev/null | wc -l)"
systemctl restart containerd.service && echo restarted`, podSlice(uid)))
	if err != nil || code != 0 || !strings.Contains(out, "restarted") {
		t.Fatalf("%v: %s", err, out)
	}
	t0 := time.Now()
	t.Logf("containerd restarted as %s's container started (%s)", pod, strings.Fields(out)[1])
	if _, err := f.n.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/"+pod, "--timeout=5m"); err != nil {
		desc, _ := f.n.Kubectl(ctx, "describe", "pod", pod)
		t.Fatalf("%v\n%s", err, desc)
	}
	// The interrupted start may make the kubelet start the container again
	// (a new scope): wait for the slots of whichever container runs.
	scope, slots := f.waitContainerSlots(t, ctx, pod, uid, 2)
	t.Logf("%s Ready and served %v after containerd's restart: %v", pod, time.Since(t0).Round(time.Millisecond), slots)
	// Converged: exactly the pre-warmed slots, and one pool for the pod.
	time.Sleep(3 * time.Second)
	if got := f.slots(t, ctx, scope); fmt.Sprint(quotaCounts(got)) != fmt.Sprint(map[string]int{"25000 100000": 2}) {
		t.Errorf("%s's slots: %v, want the 2 pre-warmed 250m", pod, got)
	}
	f.noSlotOutside(t, ctx, f.scope, scope)
	var mine []string
	for _, p := range f.pools(t, ctx) {
		if strings.HasPrefix(p, "default/"+pod+"/") {
			mine = append(mine, p)
		}
	}
	if len(mine) != 1 {
		t.Errorf("the agent's pools for %s: %v, want one", pod, mine)
	}
	ev := f.podEvents(t, ctx, pod)
	t.Logf("events of %s:\n%s", pod, ev)
	for _, line := range strings.Split(ev, "\n") {
		if strings.HasPrefix(line, "Warning") && !strings.Contains(line, "containerd") {
			t.Errorf("a Warning that does not say containerd failed: %s", line)
		}
	}
	if !strings.Contains(ev, "CpuslotServing") {
		t.Errorf("no CpuslotServing event for %s", pod)
	}
	if r, out, err := f.probeQuota(t, ctx, pod, "250m", "200ms"); err != nil || r.QuotaMilli != 250 {
		t.Errorf("asking 250m in %s: %v: %s", pod, err, lastLine(out))
	}
	if _, err := f.n.Kubectl(ctx, "delete", "pod", pod, "--wait=true", "--timeout=4m"); err != nil {
		t.Fatal(err)
	}
	if out, code, err := f.n.Exec(ctx, fmt.Sprintf(`for i in $(seq 120); do [ ! -e %[1]s ] && exit 0; sleep 1; done; find %[1]s; exit 1`, podSlice(uid))); err != nil || code != 0 {
		t.Errorf("%s's slice left after the delete: %v\n%s", pod, err, out)
	}
}

// podStart measures pod start on this node, the same spec served and not
// (cpuslot.dev/enabled "true" vs "false"): pairs started together, so both
// see the same load; apply to Ready, and for the served one apply to its
// slots made. Numbers only (the node is emulated): the agent sits on no
// path to Ready, and this shows whether it slows pods down anyway. One
// pair per run keeps CI short; CPUSLOT_E2E_PODSTART_PAIRS=N measures N.
func (f *served) podStart(t *testing.T) {
	pairs := 1
	if v := os.Getenv("CPUSLOT_E2E_PODSTART_PAIRS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 20 {
			t.Fatalf("CPUSLOT_E2E_PODSTART_PAIRS=%q: want 1..20", v)
		}
		pairs = n
	}
	ctx := f.ctx(t, time.Duration(pairs)*5*time.Minute)
	var served, plain, slotted []time.Duration
	for i := 0; i < pairs; i++ {
		s, p := fmt.Sprintf("start-s%d", i), fmt.Sprintf("start-p%d", i)
		spec := func(name string) string {
			return servedPod(servedPodSpec{name: name, prewarm: "250m=2", request: "100m", limit: "500m", args: `["serve"]`})
		}
		plainSpec := strings.Replace(spec(p), `cpuslot.dev/enabled: "true"`, `cpuslot.dev/enabled: "false"`, 1)
		manifest := writeManifest(t, spec(s)+"---\n"+plainSpec)
		t0 := time.Now()
		if _, err := f.n.Kubectl(ctx, "apply", "-f", manifest); err != nil {
			t.Fatal(err)
		}
		type res struct {
			name string
			d    time.Duration
			err  error
		}
		done := make(chan res, 2)
		for _, name := range []string{s, p} {
			go func() {
				_, err := f.n.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=5m")
				done <- res{name, time.Since(t0), err}
			}()
		}
		for range 2 {
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.name == s {
				served = append(served, r.d)
			} else {
				plain = append(plain, r.d)
			}
		}
		scope, uid, _ := containerScope(t, ctx, f.n, "default", s)
		f.waitSlots(t, ctx, uid, scope, 2)
		slotted = append(slotted, time.Since(t0))
		if _, err := f.n.Kubectl(ctx, "delete", "pod", s, p, "--wait=true", "--timeout=4m"); err != nil {
			t.Fatal(err)
		}
	}
	med := func(d []time.Duration) time.Duration {
		c := slices.Clone(d)
		sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
		return c[len(c)/2]
	}
	round := func(d []time.Duration) []string {
		var s []string
		for _, x := range d {
			s = append(s, x.Round(10*time.Millisecond).String())
		}
		return s
	}
	t.Logf("pod start, apply to Ready, %d pairs started together: served %v, not served %v", pairs, round(served), round(plain))
	t.Logf("median served %v / not served %v = %.2fx; served: slots made %v after apply (median %v)",
		med(served).Round(10*time.Millisecond), med(plain).Round(10*time.Millisecond),
		float64(med(served))/float64(med(plain)), round(slotted), med(slotted).Round(10*time.Millisecond))
}

// undelegatedScope: a container whose systemd scope does not delegate its
// subtree (its trusted.delegate mark removed, as a scope made without
// Delegate=yes would be). systemd owns such a cgroup and may reset it, so
// the agent makes no slot there: a Warning Event and a log line say why,
// the scope stays as runc made it, and the pod runs on unserved.
func (f *served) undelegatedScope(t *testing.T) {
	ctx := f.ctx(t, 6*time.Minute)
	const pod = "nodeleg"
	if _, err := f.n.Kubectl(ctx, "apply", "-f", writeManifest(t, servedPod(servedPodSpec{
		name: pod, prewarm: "250m=2", request: "100m", limit: "1", args: `["serve"]`, disabled: true,
	}))); err != nil {
		t.Fatal(err)
	}
	defer f.n.Kubectl(context.WithoutCancel(ctx), "delete", "pod", pod, "--ignore-not-found", "--wait=false")
	if _, err := f.n.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/"+pod, "--timeout=4m"); err != nil {
		t.Fatal(err)
	}
	scope, _, _ := containerScope(t, ctx, f.n, "default", pod)
	mark := guest(t, ctx, f.n, fmt.Sprintf(`python3 -c 'import os,sys; p=sys.argv[1]; print(os.getxattr(p, "trusted.delegate").decode()); os.removexattr(p, "trusted.delegate")' %s`, scope))
	t.Logf("%s's scope had trusted.delegate=%q (runc asks systemd for Delegate=yes); removed", pod, mark)
	if mark != "1" {
		t.Errorf("runc's scope was marked trusted.delegate=%q, want 1", mark)
	}
	if _, err := f.n.Kubectl(ctx, "annotate", "pod", pod, "cpuslot.dev/enabled=true", "--overwrite"); err != nil {
		t.Fatal(err)
	}
	var ev string
	for start := time.Now(); ; time.Sleep(2 * time.Second) {
		ev = f.podEvents(t, ctx, pod)
		if strings.Contains(ev, "does not delegate") || time.Since(start) > 2*time.Minute {
			break
		}
	}
	t.Logf("events of %s:\n%s", pod, ev)
	if !strings.Contains(ev, "Warning CpuslotPrepareFailed") || !strings.Contains(ev, "does not delegate") {
		t.Errorf("no Warning CpuslotPrepareFailed naming the missing delegation within 2 min")
	}
	if strings.Contains(ev, "CpuslotServing") {
		t.Errorf("the undelegated scope was served")
	}
	state := guest(t, ctx, f.n, fmt.Sprintf(`cd %s && echo "$(cat cgroup.type) [$(cat cgroup.subtree_control)] $(ls -d cpuslot-* 2>/dev/null | wc -l)"`, scope))
	t.Logf("the scope: type, subtree_control, slots: %s", state)
	if state != "domain [] 0" {
		t.Errorf("the undelegated scope was changed: %q, want %q", state, "domain [] 0")
	}
	logs, _ := f.n.Kubectl(ctx, "-n", f.ns, "logs", "-l", "app.kubernetes.io/name=cpuslot", "--tail=200")
	if !strings.Contains(logs, "does not delegate") {
		t.Errorf("no agent log line names the missing delegation:\n%s", logs)
	}
}
