package cluster

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	// Interrupted: take down whatever cluster a test has up.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "cluster test: got %v: tearing down\n", s)
		if err := DownAll(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(130)
	}()
	os.Exit(m.Run())
}

func TestSplitRule(t *testing.T) {
	got, err := splitRule(`-A INPUT -m comment --comment "kubernetes health check \"service\" rules" -j KUBE-NODEPORTS`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-A", "INPUT", "-m", "comment", "--comment", `kubernetes health check "service" rules`, "-j", "KUBE-NODEPORTS"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if _, err := splitRule(`-A X --comment "open`); err == nil {
		t.Fatal("unbalanced quote accepted")
	}
}

func TestSnapshotDiff(t *testing.T) {
	a := &Snapshot{
		Sysctls:  map[string]string{"kernel/panic": "0"},
		Iptables: map[string][]string{"iptables-save/filter": {":INPUT ACCEPT"}},
		Paths:    map[string][]string{"/var/lib/kubelet": nil},
		Mounts:   []string{"/"},
		Links:    []string{"eth0", "lo"},
		Cgroups:  map[string][]string{"/sys/fs/cgroup/cpu": {}},
	}
	b := &Snapshot{
		Sysctls:  map[string]string{"kernel/panic": "10"},
		Iptables: map[string][]string{"iptables-save/filter": {":INPUT ACCEPT", ":KUBE-FIREWALL -"}},
		Paths:    map[string][]string{"/var/lib/kubelet": {}},
		Mounts:   []string{"/", "/run/netns/cni-1", "/tmp/other-test/proc"},
		Links:    []string{"cpuslot0", "eth0", "lo"},
		Cgroups:  map[string][]string{"/sys/fs/cgroup/cpu": {"kubepods"}},
	}
	if d := a.Diff(a); len(d) != 0 {
		t.Fatalf("a snapshot differs from itself: %v", d)
	}
	d := strings.Join(a.Diff(b), "\n")
	if strings.Contains(d, "other-test") {
		t.Errorf("diff reports a mount outside the cluster's paths:\n%s", d)
	}
	for _, want := range []string{"sysctl kernel.panic", "KUBE-FIREWALL", "path /var/lib/kubelet: created", "mount /run/netns/cni-1", "cpuslot0", "kubepods"} {
		if !strings.Contains(d, want) {
			t.Errorf("diff lacks %q:\n%s", want, d)
		}
	}
}

func up(t *testing.T, opts Options) *Cluster {
	t.Helper()
	Need(t, &Cluster{})
	opts.Logf = t.Logf
	if err := opts.Defaults(); err != nil {
		t.Fatal(err)
	}
	if err := opts.CheckDeps(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := Up(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const testPod = `
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: probe
    image: ` + ProbeImage + `
    imagePullPolicy: Never
    readinessProbe:
      httpGet: {path: /healthz, port: 8080}
      periodSeconds: 1
`

func runPod(t *testing.T, c *Cluster, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := c.Apply(ctx, fmt.Sprintf(testPod, name)); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := c.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=90s"); err != nil {
		desc, _ := c.Kubectl(ctx, "describe", "pod", name)
		t.Fatalf("%v: %s\n%s", err, out, desc)
	}
}

// changed asserts that a running cluster did change the machine in the
// ways Down must undo, so that the restore checks below mean something.
func changed(t *testing.T, before *Snapshot) {
	t.Helper()
	now := TakeSnapshot()
	d := strings.Join(before.Diff(now), "\n")
	for _, want := range []string{"kubepods", "KUBE-", bridgeName, "/var/lib/kubelet"} {
		if !strings.Contains(d, want) {
			t.Errorf("a running cluster shows no change mentioning %q; diff:\n%s", want, d)
		}
	}
	t.Logf("while up, the machine differs from before in %d ways, e.g. sysctls: %s", len(before.Diff(now)), grepLines(d, "sysctl"))
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}

// restored asserts the machine is as in before, explicitly for what the
// kubelet and the CNI plugins are known to change.
func restored(t *testing.T, before *Snapshot) {
	t.Helper()
	now := TakeSnapshot()
	if d := before.Diff(now); len(d) > 0 {
		t.Errorf("machine differs after Down:\n  %s", strings.Join(d, "\n  "))
	}
	for _, k := range []string{"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory", "net/ipv4/ip_forward"} {
		if now.Sysctls[k] != before.Sysctls[k] {
			t.Errorf("sysctl %s = %q, was %q", k, now.Sysctls[k], before.Sysctls[k])
		}
	}
	for key, lines := range now.Iptables {
		for _, l := range lines {
			if strings.Contains(l, "KUBE-") && !setOf(before.Iptables[key])[l] {
				t.Errorf("%s: %s left", key, l)
			}
		}
	}
	for _, p := range trackedPaths {
		if before.Paths[p] == nil {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s left", p)
			}
		}
	}
	for root, dirs := range now.Cgroups {
		for _, d := range dirs {
			if ourCgroup(d) && !setOf(before.Cgroups[root])[d] {
				t.Errorf("cgroup %s/%s left", root, d)
			}
		}
	}
	if _, err := os.Stat(DefaultRunDir); err == nil {
		t.Errorf("%s left", DefaultRunDir)
	}
	if _, err := os.Stat(lockPath); err == nil {
		t.Errorf("%s left", lockPath)
	}
}

// TestUpDownRestoresMachine: a cluster with a running pod, taken down,
// leaves the machine as it was.
func TestUpDownRestoresMachine(t *testing.T) {
	before := TakeSnapshot()
	c := up(t, Options{})
	defer c.Down()
	for _, tm := range c.Timings {
		t.Logf("timing: %-45s %v", tm.Phase, tm.Duration.Round(time.Millisecond))
	}
	runPod(t, c, "restore-check")
	changed(t, before)
	t0 := time.Now()
	if err := c.Down(); err != nil {
		t.Fatalf("Down: %v", err)
	}
	t.Logf("Down took %v", time.Since(t0).Round(time.Millisecond))
	restored(t, before)
}

// TestCrashedRunIsCleanedAtNextUp: a run that ends without Down (its test
// process killed) leaves processes, pods, mounts and changed settings; the
// next Up stops those processes by pidfile and restores the machine to the
// crashed run's own snapshot before starting.
func TestCrashedRunIsCleanedAtNextUp(t *testing.T) {
	before := TakeSnapshot()
	crashed := up(t, Options{})
	runPod(t, crashed, "crashed-run")
	// Abandon it as a killed process would: no Down; only its lock goes
	// (the kernel drops a dead process's flock).
	track(crashed, false)
	crashed.lock.Close()
	crashed.lock = nil
	pids := pidsMentioning(DefaultRunDir + "/")
	if len(pids) < 5 {
		t.Fatalf("only %d processes of the abandoned run found", len(pids))
	}

	c := up(t, Options{})
	defer c.Down()
	for _, pid := range pids {
		if procStart(pid) != 0 && !zombie(pid) {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(b), DefaultRunDir) {
				t.Errorf("process %d of the abandoned run still runs: %s", pid, strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
	}
	// The new run's snapshot is the machine as it was before the crashed
	// one: nothing of it leaked into the baseline.
	if d := before.Diff(c.Snapshot()); len(d) > 0 {
		t.Errorf("baseline of the next run differs from the machine before the crashed run:\n  %s", strings.Join(d, "\n  "))
	}
	runPod(t, c, "after-crash")
	if err := c.Down(); err != nil {
		t.Fatalf("Down: %v", err)
	}
	restored(t, before)
}

// TestKubectlOutputIsStdout: what kubectl prints on its standard error
// while it succeeds (client-go's klog lines, such as the exec websocket's
// "Unknown stream id 1, discarding message") is not part of the output a
// test parses; when kubectl fails, both streams are in the error.
func TestKubectlOutputIsStdout(t *testing.T) {
	dir := t.TempDir()
	fake := dir + "/kubectl"
	script := "#!/bin/sh\n" +
		"echo 'E1201 14:04:09.253126 23615 websocket.go:296] Unknown stream id 1, discarding message' >&2\n" +
		"echo '{\"pid1\":\"/sbin/init\"}'\n" +
		"[ \"$3\" = fail ] && { echo 'Error from server (NotFound): pods \"x\" not found' >&2; exit 1; }\n" +
		"exit 0\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{kubectl: fake, kubeconfig: dir + "/kubeconfig"}
	out, err := c.Kubectl(context.Background(), "exec")
	if err != nil {
		t.Fatal(err)
	}
	if out != "{\"pid1\":\"/sbin/init\"}\n" {
		t.Errorf("output %q: want standard output only", out)
	}
	_, err = c.Kubectl(context.Background(), "fail")
	if err == nil || !strings.Contains(err.Error(), "NotFound") || !strings.Contains(err.Error(), "pid1") {
		t.Errorf("failure: %v: want both streams in the error", err)
	}
}
