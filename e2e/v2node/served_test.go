package v2node

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
	"github.com/cpuslot/cpuslot/test/vm"
)

// TestAgentServesPodInSystemdScope: the chart installs the agent on the v2
// node; a pod that opts in by annotation gets its socket and threaded
// cpuslot-* slots inside its container's cri-containerd-<id>.scope, which
// becomes "domain threaded"; systemd keeps the scope's unit; kubectl exec
// into the served container still works (runc exec into a domain threaded
// cgroup).
func TestAgentServesPodInSystemdScope(t *testing.T) {
	n := need(t)
	// The budget is what go test's -timeout (E2E_TIMEOUT) leaves until
	// TestMain takes the node down, less room for the deferred uninstall
	// (its 5 min, and a minute to spare): on a slow day the emulated node needs most of it, and a
	// fixed 45 min ran out at the last step of a run that was passing.
	budget := 45 * time.Minute
	if !downAt.IsZero() {
		budget = time.Until(downAt) - 6*time.Minute
	}
	if budget < 10*time.Minute {
		t.Fatalf("the test binary's -timeout leaves %v for the served node's steps; give go test -timeout 70m", budget.Round(time.Second))
	}
	t.Logf("budget for the served node's steps: %v", budget.Round(time.Second))
	ctx, cancel := context.WithTimeout(t.Context(), budget)
	defer cancel()
	agentTar := filepath.Join(n.RepoDir(), "bin", "images", "node-agent.tar")
	if err := n.ImportImage(ctx, agentTar); err != nil {
		t.Fatalf("%v (make images writes it)", err)
	}
	helmBin, err := exec.Command("bash", filepath.Join(n.RepoDir(), "hack", "helm.sh")).Output()
	if err != nil {
		t.Fatalf("hack/helm.sh: %v", err)
	}
	helm := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, strings.TrimSpace(string(helmBin)), append([]string{"--kubeconfig", n.Kubeconfig()}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("%v (the test's budget of %v ran out)", err, budget.Round(time.Second))
			}
			return string(out), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return string(out), nil
	}
	const ns, release = "cpuslot-system", "cpuslot"
	repo, tag, _ := strings.Cut(cluster.AgentImage, ":")
	t0 := time.Now()
	// No kube-proxy on this node: the agent reaches the API server at the
	// node's address.
	if out, err := helm("install", release, filepath.Join(n.RepoDir(), "charts", "cpuslot"),
		"--namespace", ns, "--create-namespace",
		"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
		"--set", "kubernetes.containerdSocket="+ContainerdSocket,
		"--set", "apiServer.host="+vm.GuestIP, "--set", fmt.Sprintf("apiServer.port=%d", apiPort),
		"--set", "logLevel=debug",
		// The tests read /debug/pools through the API server's pod proxy,
		// which does not arrive on the agent pod's loopback.
		"--set", "metrics.debugPoolsRemote=true",
		// Generous: the node is emulated, and a loaded guest answered
		// no /healthz within the default 2 s three times in a row.
		"--set", "livenessProbe.timeoutSeconds=15", "--set", "readinessProbe.timeoutSeconds=15",
		"--wait", "--timeout", "8m"); err != nil {
		desc, _ := n.Kubectl(ctx, "-n", ns, "describe", "pods")
		t.Fatalf("%v\n%s\n--- pods:\n%s", err, out, desc)
	}
	uninstalled := false
	defer func() {
		if uninstalled {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, strings.TrimSpace(string(helmBin)), "--kubeconfig", n.Kubeconfig(), "uninstall", release, "-n", ns, "--wait", "--timeout", "4m")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("helm uninstall: %v: %s", err, out)
		}
	}()
	if out, err := n.Kubectl(ctx, "-n", ns, "rollout", "status", "daemonset/"+release, "--timeout=8m"); err != nil {
		desc, _ := n.Kubectl(ctx, "-n", ns, "describe", "pods")
		t.Fatalf("%v\n%s\n--- pods:\n%s", err, out, desc)
	}
	t.Logf("helm install: agent DaemonSet Ready %v after the command started (emulated node)", time.Since(t0).Round(time.Second))
	// containerd's NRI is on (writeConfig) and the chart's nri.socket is
	// its default: the agent connects as a plugin (in the background, so
	// polled).
	for deadline := time.Now().Add(2 * time.Minute); ; {
		logs, _ := n.Kubectl(ctx, "-n", ns, "logs", "-l", "app.kubernetes.io/name=cpuslot", "--tail=-1")
		if l := firstLine(logs, "connected to the runtime as an NRI plugin"); l != "" {
			t.Logf("NRI: %s", l)
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			sock, _, _ := n.Exec(ctx, "ls -l "+NRISocket+" 2>&1")
			t.Fatalf("the agent did not connect to containerd's NRI socket within 2 min (%s)\n--- its log:\n%s", strings.TrimSpace(sock), logs)
		}
		time.Sleep(2 * time.Second)
	}

	// fn keeps two threads invoking through the agent (probe slots: acquire
	// a 250m slot, burn 2 ms, release, pause), has an exec liveness probe,
	// and pre-warms one 250m slot more than the load holds, for the quota
	// measurement: no slot is grown, so the set of slots is fixed.
	if _, err := n.Kubectl(ctx, "apply", "-f", writeManifest(t, servedPod(servedPodSpec{
		name: "fn", prewarm: "250m=3,500m=1", request: "500m", limit: "1",
		args:     `["slots", "-threads", "2", "-burn", "2ms", "-pause", "20ms"]`,
		liveness: true,
	}))); err != nil {
		t.Fatal(err)
	}
	defer n.Kubectl(context.WithoutCancel(ctx), "delete", "pod", "fn", "--wait=false")
	if _, err := n.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/fn", "--timeout=8m"); err != nil {
		desc, _ := n.Kubectl(ctx, "describe", "pod", "fn")
		t.Fatalf("%v\n%s", err, desc)
	}
	scope, uid, id := containerScope(t, ctx, n, "default", "fn")

	// The agent makes the socket and the pre-warmed slots (4) in the scope.
	sock := "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~empty-dir/cpuslot/agent.sock"
	script := fmt.Sprintf(`for i in $(seq 300); do
	[ -S %[1]s ] && [ "$(ls -d %[2]s/cpuslot-* 2>/dev/null | wc -l)" -ge 4 ] && break
	sleep 1
done
[ -S %[1]s ] || { echo "no socket %[1]s"; exit 1; }
for s in %[2]s/cpuslot-*; do echo "$(basename $s) $(cat $s/cgroup.type) $(cat $s/cpu.max)"; done
echo "scope $(cat %[2]s/cgroup.type) subtree=$(cat %[2]s/cgroup.subtree_control)"
`, sock, scope)
	out, code, err := n.Exec(ctx, script)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		logs, _ := n.Kubectl(ctx, "-n", ns, "logs", "-l", "app.kubernetes.io/name=cpuslot", "--tail=40")
		ev, _ := n.Kubectl(ctx, "get", "events", "--field-selector", "involvedObject.name=fn")
		t.Fatalf("pod fn not served within 300 s: %s\n--- agent logs:\n%s\n--- events:\n%s", out, logs, ev)
	}
	t.Logf("slots in %s:\n%s", scope, out)
	slots := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && strings.HasPrefix(f[0], "cpuslot-"):
			slots++
			if f[1] != "threaded" {
				t.Errorf("slot %s is %q, want threaded", f[0], f[1])
			}
		case len(f) >= 3 && f[0] == "scope":
			if f[1]+" "+f[2] != "domain threaded" {
				t.Errorf("scope cgroup.type %q, want domain threaded", f[1]+" "+f[2])
			}
		}
	}
	if slots != 4 {
		t.Errorf("%d slots, want the 4 pre-warmed", slots)
	}
	// systemd still has the scope unit, active.
	if got := guest(t, ctx, n, "systemctl is-active cri-containerd-"+id+".scope || true"); got != "active" {
		t.Errorf("cri-containerd-%s.scope is %q after the slots were made", id[:12], got)
	}
	// runc exec into the domain threaded scope: kubectl exec still works.
	if out, err := n.Kubectl(ctx, "exec", "fn", "--", "/probe", "info"); err != nil {
		t.Errorf("kubectl exec into the served container: %v", err)
	} else {
		t.Logf("kubectl exec into the served container: %s", strings.TrimSpace(out))
	}
	if ev, err := n.Kubectl(ctx, "get", "events", "--field-selector", "involvedObject.name=fn,reason=CpuslotServing", "-o", "name"); err != nil || strings.TrimSpace(ev) == "" {
		t.Errorf("no CpuslotServing event on the pod (%v)", err)
	}

	// What only a systemd node with v2 exercises, on the served pod, in
	// this order (later steps rely on the earlier ones' state: the
	// liveness probe's counters live until the kubelet restarts; a new pod
	// is served after containerd restarted).
	f := &served{n: n, ns: ns, release: release, pod: "fn", scope: scope, id: id}
	defer n.Kubectl(context.WithoutCancel(ctx), "delete", "pod", "small", "--ignore-not-found", "--wait=false")
	t.Run("QuotaHolds", f.quotaHolds)
	// JavaRuntimePods' image is imported in the background (minutes on
	// this node) from here on: after QuotaHolds, which wants the node's
	// CPU, and meanwhile the steps that only check behaviour or compare
	// two pods under the same load.
	startJavaImport(t, ctx, n)
	t.Run("OverheadServedVsNot", f.overheadServedVsNot)
	t.Run("DaemonReloadKeepsSlots", f.daemonReloadKeepsSlots)
	t.Run("ExecLivenessProbe", f.execLivenessProbe)
	// The Java runtime pods run from JavaRuntimePods until after
	// PrometheusQueries (the runtime dashboard's series are theirs).
	defer f.endJava(t)
	t.Run("JavaRuntimePods", f.javaRuntimePods)
	t.Run("PrometheusQueries", f.prometheusQueries)
	f.endJava(t)
	t.Run("KubeletRestart", func(t *testing.T) { f.restartUnit(t, "kubelet.service") })
	t.Run("ContainerdRestart", func(t *testing.T) { f.restartUnit(t, "containerd.service") })
	t.Run("LimitBelowSlotQuota", f.limitBelowSlotQuota)
	t.Run("DeletedPodLeavesNoSlot", f.deletedPodLeavesNoSlot)
	t.Run("Resize", f.resize)
	t.Run("ContainerRestartNewScope", f.containerRestart)
	t.Run("AgentPodDeletedUnderLoad", f.agentPodDeletedUnderLoad)
	t.Run("NoUnplannedRestart", f.noUnplannedRestart)
	t.Run("PodStartServedVsNot", f.podStart)
	t.Run("DeletedWhilePreparing", f.deletedWhilePreparing)
	t.Run("ContainerdRestartMidPrepare", f.containerdRestartMidPrepare)
	t.Run("UndelegatedScope", f.undelegatedScope)
	defer n.Kubectl(context.WithoutCancel(ctx), "delete", "deployment", "svc", "--ignore-not-found", "--wait=false")
	t.Run("Drain", f.drain)
	t.Run("SliceGone", f.sliceGone)
	// The served pod is now the one f names (Drain replaces fn with a
	// Deployment's pod).
	pod, scope, id := f.pod, f.scope, f.id

	// Uninstall as the chart's README says: cleanupOnUninstall first (the
	// rollout removes nothing: the old agent stops without the flag, the
	// new one adopts the slots), then helm uninstall, with the pod still
	// running: no cpuslot cgroup remains, and the container's scope is
	// still systemd's. (Installed with it, every agent stop would remove
	// all slots, and AgentPodDeletedUnderLoad could not see them adopted.)
	t0 = time.Now()
	before := f.slots(t, ctx, scope)
	if out, err := helm("upgrade", release, filepath.Join(n.RepoDir(), "charts", "cpuslot"), "-n", ns, "--reuse-values",
		"--set", "cleanupOnUninstall=true", "--wait", "--timeout", "8m"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := n.Kubectl(ctx, "-n", ns, "rollout", "status", "daemonset/"+release, "--timeout=8m"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if after := f.slots(t, ctx, scope); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("slots across helm upgrade --set cleanupOnUninstall=true: before %v, after %v (want kept and adopted)", before, after)
	}
	t.Logf("helm upgrade --set cleanupOnUninstall=true: rolled out in %v, slots kept", time.Since(t0).Round(time.Second))
	t0 = time.Now()
	uninstalled = true
	if out, err := helm("uninstall", release, "-n", ns, "--wait", "--timeout", "4m"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	left := guest(t, ctx, n, `for i in $(seq 120); do
	[ -z "$(find /sys/fs/cgroup/kubepods.slice -type d -name 'cpuslot-*' -print -quit)" ] && break
	sleep 1
done
find /sys/fs/cgroup/kubepods.slice -type d -name 'cpuslot-*'`)
	if left != "" {
		t.Errorf("cpuslot cgroups left after helm uninstall:\n%s", left)
	} else {
		t.Logf("helm uninstall: no cpuslot cgroup left, %v after the command started", time.Since(t0).Round(time.Second))
	}
	if got := guest(t, ctx, n, "systemctl is-active cri-containerd-"+id+".scope || true"); got != "active" {
		t.Errorf("cri-containerd-%s.scope is %q after the slots were removed", id[:12], got)
	}
	if _, err := n.Kubectl(ctx, "exec", pod, "--", "/probe", "info"); err != nil {
		t.Errorf("kubectl exec after the slots were removed: %v", err)
	}
}

// containerScope returns the systemd scope cgroup (a guest path) of the
// first container of pod ns/name, the pod's UID and the container's ID.
func containerScope(t *testing.T, ctx context.Context, n *Node, ns, name string) (scope, uid, id string) {
	t.Helper()
	out, err := n.Kubectl(ctx, "-n", ns, "get", "pod", name, "-o", "jsonpath={.metadata.uid} {.status.qosClass} {.status.containerStatuses[0].containerID}")
	if err != nil {
		t.Fatal(err)
	}
	var qos, cid string
	if _, err := fmt.Sscan(out, &uid, &qos, &cid); err != nil {
		t.Fatalf("pod status %q: %v", out, err)
	}
	id, ok := strings.CutPrefix(cid, "containerd://")
	if !ok {
		t.Fatalf("container ID %q is not containerd's", cid)
	}
	return podSlicePath(uid, qos) + "/cri-containerd-" + id + ".scope", uid, id
}

// podSlicePath is the guest path of the systemd slice of a pod with this
// UID and QoS class; Guaranteed pods sit directly in kubepods.slice.
func podSlicePath(uid, qos string) string {
	uidU := strings.ReplaceAll(uid, "-", "_")
	if q := strings.ToLower(qos); q != "guaranteed" {
		return fmt.Sprintf("/sys/fs/cgroup/kubepods.slice/kubepods-%[1]s.slice/kubepods-%[1]s-pod%[2]s.slice", q, uidU)
	}
	return "/sys/fs/cgroup/kubepods.slice/kubepods-pod" + uidU + ".slice"
}

// firstLine is the first line of text that contains sub ("": none).
func firstLine(text, sub string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
