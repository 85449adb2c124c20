package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBin returns the cached helm binary (hack/helm.sh builds it once).
func helmBin(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		repo, err := cluster.FindRepo(".")
		if err != nil {
			helmErr = err
			return
		}
		script := filepath.Join(repo, "hack", "helm.sh")
		if _, err := os.Stat(script); err != nil {
			helmErr = fmt.Errorf("hack/helm.sh missing: %w", err)
			return
		}
		out, err := exec.Command("bash", script).Output()
		if err != nil {
			helmErr = fmt.Errorf("hack/helm.sh: %v", err)
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		helmPath = lines[len(lines)-1]
	})
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmPath
}

func helm(ctx context.Context, t *testing.T, c *cluster.Cluster, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, helmBin(t), append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func chartDir(t *testing.T) string {
	repo, err := cluster.FindRepo(".")
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(repo, "charts", "cpuslot")
}

// installChart installs charts/cpuslot with the locally imported agent
// image, waits for the DaemonSet to be Ready and uninstalls it when the
// test ends (if the test has not).
func installChart(t *testing.T, c *cluster.Cluster, release, ns string, extra ...string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	repo, tag, _ := strings.Cut(cluster.AgentImage, ":")
	args := append([]string{"install", release, chartDir(t),
		"--namespace", ns, "--create-namespace",
		"--set", "image.repository=" + repo,
		"--set", "image.tag=" + tag,
		"--set", "image.pullPolicy=Never",
		"--set", "kubernetes.containerdSocket=" + c.ContainerdSocket(),
		"--set", "nri.socket=" + c.NRISocket(),
		"--set", "logLevel=debug",
		"--wait", "--timeout", "120s"}, extra...)
	t0 := time.Now()
	if out, err := helm(ctx, t, c, args...); err != nil {
		desc, _ := c.Kubectl(ctx, "-n", ns, "describe", "pods")
		logs, _ := c.Kubectl(ctx, "-n", ns, "logs", "-l", "app.kubernetes.io/name=cpuslot", "--tail=50")
		t.Fatalf("%v\n%s\n--- pods:\n%s\n--- agent logs:\n%s", err, out, desc, logs)
	}
	// helm --wait counts a DaemonSet ready when desired - maxUnavailable
	// pods are: zero on one node. Wait for the agent pod itself.
	if out, err := c.Kubectl(ctx, "-n", ns, "rollout", "status", "daemonset/"+release, "--timeout=120s"); err != nil {
		desc, _ := c.Kubectl(ctx, "-n", ns, "describe", "pods")
		t.Fatalf("%v\n%s\n--- pods:\n%s", err, out, desc)
	}
	d := time.Since(t0)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := helm(ctx, t, c, "status", release, "-n", ns); err == nil {
			helm(ctx, t, c, "uninstall", release, "-n", ns, "--wait", "--timeout", "90s")
		}
		c.Kubectl(ctx, "delete", "namespace", ns, "--wait=true", "--timeout=90s", "--ignore-not-found")
	})
	return d
}

// slotDirs lists cpuslot-* cgroups anywhere under the kubepods trees of
// every cgroup hierarchy.
// waitNoSlots waits up to 30 s after what happened at t0 for every
// cpuslot cgroup on the node to be gone.
func waitNoSlots(t *testing.T, t0 time.Time, what string) {
	t.Helper()
	var left []string
	for time.Since(t0) < 30*time.Second {
		if left = slotDirs(); len(left) == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Fatalf("%s: cpuslot cgroups remain: %v", what, left)
	}
	t.Logf("%s: no cpuslot cgroup left after %v", what, time.Since(t0).Round(time.Millisecond))
}

func slotDirs() []string {
	var out []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	if _, err := os.Stat("/sys/fs/cgroup/kubepods"); err == nil {
		roots = append(roots, "/sys/fs/cgroup/kubepods")
	}
	for _, r := range roots {
		filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && strings.HasPrefix(d.Name(), "cpuslot-") {
				out = append(out, p)
				return fs.SkipDir
			}
			return nil
		})
	}
	return out
}

const annotatedPod = `
apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: %[2]s
  annotations:
    cpuslot.dev/enabled: "true"
    cpuslot.dev/prewarm: "250m=2,500m=1"
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: cpuslot
    emptyDir: {}
  containers:
  - name: fn
    image: %[3]s
    imagePullPolicy: Never
    args: %[4]s
    env:
    - name: CPUSLOT_SOCKET
      value: /run/cpuslot/agent.sock
    volumeMounts:
    - name: cpuslot
      mountPath: /run/cpuslot
    readinessProbe:
      httpGet: {path: /healthz, port: 8080}
      periodSeconds: 1
    resources:
      requests: {cpu: 500m, memory: 32Mi}
      limits: {cpu: "1", memory: 64Mi}
`

type podInfo struct {
	UID, QOS, ContainerID string
}

// getPod returns a pod's UID, QoS class and the ID of its container named
// container.
func getPod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, container string) podInfo {
	t.Helper()
	out, err := c.Kubectl(ctx, "-n", ns, "get", "pod", name, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
		Status struct {
			QOSClass          string `json:"qosClass"`
			ContainerStatuses []struct {
				Name        string `json:"name"`
				ContainerID string `json:"containerID"`
			} `json:"containerStatuses"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatal(err)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container {
			_, id, _ := strings.Cut(cs.ContainerID, "://")
			return podInfo{UID: p.Metadata.UID, QOS: p.Status.QOSClass, ContainerID: id}
		}
	}
	t.Fatalf("pod %s/%s has no status of a container %s", ns, name, container)
	return podInfo{}
}

// TestChartServesAnnotatedPod: helm install of charts/cpuslot makes the
// agent DaemonSet Ready; a pod that opts in by annotation with the
// cpuslot emptyDir gets its socket and pre-warmed slots in its container's
// cgroup; helm uninstall (cleanupOnUninstall=true) leaves no cpuslot cgroup
// on the node while the pod still runs.
func TestChartServesAnnotatedPod(t *testing.T) {
	c := cluster.Need(t, kc)
	const ns, appNS, release = "cpuslot-system", "e2e-chart", "cpuslot"
	d := installChart(t, c, release, ns, "--set", "cleanupOnUninstall=true")
	t.Logf("helm install: agent DaemonSet Ready %v after the command started", d.Round(time.Millisecond))

	namespace(t, c, appNS)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := c.Apply(ctx, fmt.Sprintf(annotatedPod, "fn", appNS, cluster.ProbeImage, `["serve"]`)); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := c.Kubectl(ctx, "-n", appNS, "wait", "--for=condition=Ready", "pod/fn", "--timeout=90s"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	p, slots := waitServed(ctx, t, c, ns, appNS, "fn", "fn", 3)
	t.Logf("pod served: socket and %d slots in %s", len(slots), cluster.ContainerCgroupDir("cpu", p.QOS, p.UID, p.ContainerID))
	for _, s := range slots {
		q, _ := os.ReadFile(filepath.Join(s, "cpu.cfs_quota_us"))
		t.Logf("  %s: cfs_quota_us %s", filepath.Base(s), strings.TrimSpace(string(q)))
	}
	ev, err := c.Kubectl(ctx, "-n", appNS, "get", "events", "--field-selector", "involvedObject.name=fn,reason=CpuslotServing", "-o", "name")
	if err != nil || strings.TrimSpace(ev) == "" {
		t.Errorf("no CpuslotServing event on the pod (%v)", err)
	}

	// Uninstall with the pod still running: no cpuslot cgroup may remain.
	t0 := time.Now()
	if out, err := helm(ctx, t, c, "uninstall", release, "-n", ns, "--wait", "--timeout", "90s"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitNoSlots(t, t0, "helm uninstall")
}

// waitServed waits until the agent has made pod name's socket and at least
// n slots in the cgroup of its container named container.
func waitServed(ctx context.Context, t *testing.T, c *cluster.Cluster, agentNS, ns, name, container string, n int) (podInfo, []string) {
	t.Helper()
	p := getPod(ctx, t, c, ns, name, container)
	sock := filepath.Join("/var/lib/kubelet/pods", p.UID, "volumes/kubernetes.io~empty-dir/cpuslot/agent.sock")
	cg := cluster.ContainerCgroupDir("cpu", p.QOS, p.UID, p.ContainerID)
	deadline := time.Now().Add(30 * time.Second)
	for {
		slots, _ := filepath.Glob(filepath.Join(cg, "cpuslot-*"))
		_, serr := os.Stat(sock)
		if serr == nil && len(slots) >= n {
			return p, slots
		}
		if time.Now().After(deadline) {
			logs, _ := c.Kubectl(ctx, "-n", agentNS, "logs", "-l", "app.kubernetes.io/name=cpuslot", "--tail=20")
			ev, _ := c.Kubectl(ctx, "-n", ns, "get", "events", "--field-selector", "involvedObject.name="+name)
			t.Fatalf("pod %s/%s not served after 30 s: socket %s: %v; slots in %s: %v\n--- agent logs:\n%s\n--- events:\n%s", ns, name, sock, serr, cg, slots, logs, ev)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestDeletedServedPodLeavesNoSlot: with the chart's defaults (slots are
// kept when the agent stops), a served pod's slots go with the pod: after
// its deletion no cpuslot cgroup is left on the node; then helm uninstall
// leaves none either.
func TestDeletedServedPodLeavesNoSlot(t *testing.T) {
	c := cluster.Need(t, kc)
	const ns, appNS, release = "cpuslot-system", "e2e-podgone", "cpuslot"
	installChart(t, c, release, ns)
	namespace(t, c, appNS)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := c.Apply(ctx, fmt.Sprintf(annotatedPod, "fn", appNS, cluster.ProbeImage, `["serve"]`)); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := c.Kubectl(ctx, "-n", appNS, "wait", "--for=condition=Ready", "pod/fn", "--timeout=90s"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitServed(ctx, t, c, ns, appNS, "fn", "fn", 3)
	t0 := time.Now()
	if out, err := c.Kubectl(ctx, "-n", appNS, "delete", "pod", "fn", "--wait=true", "--timeout=60s"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitNoSlots(t, t0, "served pod deleted")
	if out, err := helm(ctx, t, c, "uninstall", release, "-n", ns, "--wait", "--timeout", "90s"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if left := slotDirs(); len(left) > 0 {
		t.Fatalf("after helm uninstall, cpuslot cgroups remain: %v", left)
	}
}
