package v2node

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// node is brought up once for the package (the emulated node is slow).
var (
	node   *Node
	upErr  error
	upTook time.Duration
)

func TestMain(m *testing.M) {
	flag.Parse()
	if !cluster.Enabled() || os.Geteuid() != 0 {
		os.Exit(m.Run())
	}
	logger := log.New(os.Stderr, "", log.Ltime|log.Lmicroseconds)
	// An interrupted run, and one about to hit go test's own -timeout
	// (which runs no deferred code), still take the node down: qemu would
	// die with the test by Pdeathsig, but the node's host directories would
	// stay.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var last <-chan time.Time
	if d, ok := deadline(); ok {
		downAt = d.Add(-time.Minute)
		last = time.After(time.Until(downAt))
	}
	var up atomic.Pointer[Node]
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		select {
		case sig := <-sigs:
			logger.Printf("v2node: %v; taking the node down", sig)
		case <-last:
			logger.Printf("v2node: a minute before go test's -timeout; taking the node down")
		}
		cancel() // an Up in progress tears down what it started
		if n := up.Load(); n != nil {
			n.Down()
			os.Exit(1)
		}
	}()
	start := time.Now()
	node, upErr = Up(ctx, Options{Logf: logger.Printf})
	upTook = time.Since(start)
	up.Store(node)
	if upErr == nil {
		logger.Printf("v2node: up in %v (boot %v, node Ready %v after qemu started)",
			upTook.Round(time.Second), node.Boot.Round(time.Second), node.Ready.Round(time.Second))
	}
	code := m.Run()
	if node != nil {
		node.Down()
	}
	os.Exit(code)
}

// downAt is when TestMain takes the node down, a minute before go test's
// -timeout as counted from TestMain's start (Up included; testing's own
// alarm, and t.Deadline, start only after Up). Zero: no timeout.
var downAt time.Time

func deadline() (time.Time, bool) {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return time.Time{}, false
	}
	d, err := time.ParseDuration(f.Value.String())
	if err != nil || d <= 0 {
		return time.Time{}, false
	}
	return time.Now().Add(d), true
}

// need skips without CPUSLOT_E2E=1 and fails when the node did not come up.
func need(t *testing.T) *Node {
	t.Helper()
	if !cluster.Enabled() {
		t.Skip("CPUSLOT_E2E=1 runs the e2e tests (they boot a VM node)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("CPUSLOT_E2E=1 needs root")
	}
	if upErr != nil {
		t.Fatalf("the v2 node did not come up (after %v): %v", upTook.Round(time.Second), upErr)
	}
	return node
}

func guest(t *testing.T, ctx context.Context, n *Node, script string) string {
	t.Helper()
	out, err := n.MustExec(ctx, script)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// TestVersionsMatchDepsScript: the versions the node looks for are those
// hack/v2node-deps.sh builds.
func TestVersionsMatchDepsScript(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(root, "hack", "v2node-deps.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]string{
		"CPUSLOT_V2_K8S_VERSION":     KubernetesVersion,
		"CPUSLOT_CONTAINERD_VERSION": ContainerdVersion,
		"CPUSLOT_RUNC_VERSION":       RuncVersion,
	} {
		re := regexp.MustCompile(`\$\{` + v + `:-([^}]+)\}`)
		m := re.FindSubmatch(script)
		if m == nil {
			t.Errorf("hack/v2node-deps.sh has no ${%s:-...} default", v)
		} else if string(m[1]) != want {
			t.Errorf("hack/v2node-deps.sh builds %s %s, the node wants %s", v, m[1], want)
		}
	}
}

// TestNodeIsSystemdCgroupV2 checks the node is what users run: systemd as
// PID 1 owning cgroup2 (nsdelegate, memory_recursiveprot), containerd 2 and
// the current runc, the kubelet on the systemd cgroup driver, Ready.
func TestNodeIsSystemdCgroupV2(t *testing.T) {
	n := need(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	t.Logf("boot to systemd's control shell %v, to node Ready %v (qemu start to Ready, emulated)",
		n.Boot.Round(time.Second), n.Ready.Round(time.Second))

	if got := guest(t, ctx, n, "cat /proc/1/comm"); got != "systemd" {
		t.Errorf("PID 1 is %q, want systemd", got)
	}
	t.Logf("systemd: %s", guest(t, ctx, n, "systemctl --version | head -n1"))
	mnt := guest(t, ctx, n, "findmnt -n -o FSTYPE,OPTIONS /sys/fs/cgroup")
	for _, want := range []string{"cgroup2", "nsdelegate", "memory_recursiveprot"} {
		if !strings.Contains(mnt, want) {
			t.Errorf("/sys/fs/cgroup: %q, want %s", mnt, want)
		}
	}
	for _, u := range Units {
		if got := guest(t, ctx, n, "systemctl is-active "+u+" || true"); got != "active" {
			t.Errorf("%s is %q", u, got)
		}
	}
	// The binaries the units run, and what the API reports of them.
	if got := guest(t, ctx, n, filepath.Join(n.bins.containerd, "containerd")+" --version"); !strings.Contains(got, " "+ContainerdVersion+" ") {
		t.Errorf("containerd --version: %q, want %s", got, ContainerdVersion)
	}
	if got := guest(t, ctx, n, n.bins.runc+" --version"); !strings.HasPrefix(got, "runc version "+strings.TrimPrefix(RuncVersion, "v")+"\n") ||
		!strings.Contains(got, "libseccomp") {
		t.Errorf("runc --version: %q, want %s with seccomp", got, RuncVersion)
	}
	info, err := n.Kubectl(ctx, "get", "node", NodeName, "-o", "jsonpath={.status.nodeInfo.kubeletVersion} {.status.nodeInfo.containerRuntimeVersion}")
	if err != nil {
		t.Fatal(err)
	}
	if want := KubernetesVersion + " containerd://" + strings.TrimPrefix(ContainerdVersion, "v"); info != want {
		// containerd reports its version with or without the v.
		if info != KubernetesVersion+" containerd://"+ContainerdVersion {
			t.Errorf("node info %q, want %q", info, want)
		}
	}
	// The kubelet's running configuration, through the API server's proxy
	// (which also proves the API server reaches the kubelet).
	raw, err := n.Kubectl(ctx, "get", "--raw", "/api/v1/nodes/"+NodeName+"/proxy/configz")
	if err != nil {
		t.Fatal(err)
	}
	var configz struct {
		KubeletConfig struct {
			CgroupDriver string `json:"cgroupDriver"`
		} `json:"kubeletconfig"`
	}
	if err := json.Unmarshal([]byte(raw), &configz); err != nil {
		t.Fatalf("configz: %v: %s", err, raw)
	}
	if configz.KubeletConfig.CgroupDriver != "systemd" {
		t.Errorf("kubelet cgroupDriver %q, want systemd", configz.KubeletConfig.CgroupDriver)
	}
	// The kubelet's slices are systemd units.
	if got := guest(t, ctx, n, "systemctl is-active kubepods.slice || true"); got != "active" {
		t.Errorf("kubepods.slice is %q, want active", got)
	}
}

// TestPodRunsInSystemdScope: a pod runs, its container's cgroup is the
// systemd scope runc makes (kubepods.slice/.../cri-containerd-<id>.scope),
// and kubectl exec and logs work.
func TestPodRunsInSystemdScope(t *testing.T) {
	n := need(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	name := "scope-probe"
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: probe
    image: %s
    imagePullPolicy: Never
    resources:
      limits: {cpu: 500m, memory: 64Mi}
      requests: {cpu: 100m, memory: 32Mi}
`, name, cluster.ProbeImage)
	f := filepath.Join(t.TempDir(), "pod.yaml")
	if err := os.WriteFile(f, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := n.Kubectl(ctx, "apply", "-f", f); err != nil {
		t.Fatal(err)
	}
	defer n.Kubectl(context.WithoutCancel(ctx), "delete", "pod", name, "--wait=false")
	if _, err := n.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=8m"); err != nil {
		desc, _ := n.Kubectl(context.WithoutCancel(ctx), "describe", "pod", name)
		t.Fatalf("%v\n%s\nnode:\n%s", err, desc, n.Diagnose(ctx))
	}
	t.Logf("pod Ready %v after kubectl apply (emulated node)", time.Since(start).Round(time.Millisecond))

	scope, _, id := containerScope(t, ctx, n, "default", name)
	podSlice := filepath.Base(filepath.Dir(scope))
	procs := guest(t, ctx, n, "cat "+scope+"/cgroup.procs")
	if procs == "" {
		t.Fatalf("%s holds no process", scope)
	}
	// The container's process is in it, as its own /proc/PID/cgroup says.
	pid := strings.Fields(procs)[0]
	want := "0::" + strings.TrimPrefix(scope, "/sys/fs/cgroup")
	if got := guest(t, ctx, n, "cat /proc/"+pid+"/cgroup"); got != want {
		t.Errorf("/proc/%s/cgroup = %q, want %q", pid, got, want)
	}
	// The container's CPU limit (500m) is its scope's cpu.max.
	if got := guest(t, ctx, n, "cat "+scope+"/cpu.max"); got != "50000 100000" {
		t.Errorf("%s/cpu.max = %q, want 50000 100000 (limit 500m)", scope, got)
	}
	// The unit systemd knows (runc makes it through systemd).
	unitProps := guest(t, ctx, n, "systemctl show -p Delegate,Slice,ControlGroup cri-containerd-"+id+".scope")
	t.Logf("cri-containerd-%s.scope: %s", id[:12], strings.ReplaceAll(unitProps, "\n", ", "))
	if !strings.Contains(unitProps, "Slice="+podSlice) {
		t.Errorf("scope unit properties %q, want Slice=%s", unitProps, podSlice)
	}

	// kubectl exec through the API server and the kubelet; the container
	// has its own cgroup namespace, so it sees itself at the root.
	execOut, err := n.Kubectl(ctx, "exec", name, "--", "/probe", "info")
	if err != nil {
		t.Fatal(err)
	}
	var inf struct {
		Cgroup string `json:"cgroup"`
	}
	if err := json.Unmarshal([]byte(execOut), &inf); err != nil {
		t.Fatalf("probe info: %v: %q", err, execOut)
	}
	if strings.TrimSpace(inf.Cgroup) != "0::/" {
		t.Errorf("exec'd process sees cgroup %q, want 0::/ (own cgroup namespace)", inf.Cgroup)
	}
	if logs, err := n.Kubectl(ctx, "logs", name); err != nil || !strings.Contains(logs, "probe: started") {
		t.Errorf("kubectl logs: %v: %q", err, logs)
	}
}
