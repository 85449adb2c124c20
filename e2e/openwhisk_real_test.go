package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// The real OpenWhisk, built from upstream checkouts by
// hack/openwhisk-build.sh (deploy/openwhisk/README.md): its standalone
// (controller and invoker in one process, memory store, lean messaging) with
// the KubernetesContainerFactory, and wsk. Neither is in this repository, so
// the test runs only when both are given.
const (
	envOpenWhiskStandalone = "OPENWHISK_STANDALONE" // bin/openwhisk-standalone of the build
	envOpenWhiskWsk        = "OPENWHISK_WSK"        // wsk of the build
	// standalone.conf's guest key (the standalone creates the guest namespace with it)
	openWhiskGuestKey = "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP"
)

// realOpenWhiskManifest maps the project's kinds to the runtime image the
// e2e imports (the action pods run it; nothing is pulled).
const realOpenWhiskManifest = `{"runtimes": {
  "java": [{"kind": "java:cpuslot", "default": true, "image": {"prefix": "cpuslot", "name": "runtime-jvm", "tag": "dev"},
            "deprecated": false, "requireMain": true,
            "attached": {"attachmentName": "jarfile", "attachmentType": "application/java-archive"}}],
  "nodejs": [{"kind": "nodejs:cpuslot", "default": true, "image": {"prefix": "cpuslot", "name": "runtime-jvm", "tag": "dev"},
              "deprecated": false, "attached": {"attachmentName": "codefile", "attachmentType": "text/plain"}}],
  "python": [{"kind": "python:cpuslot", "default": true, "image": {"prefix": "cpuslot", "name": "runtime-jvm", "tag": "dev"},
              "deprecated": false, "attached": {"attachmentName": "codefile", "attachmentType": "text/plain"}}]
}}`

// realOpenWhiskConf is the standalone's configuration: its KCF settings
// (standalone-kcf.conf) and this project's invoker settings
// (deploy/openwhisk/kustomize/invoker-patch.yaml), for a 2-core node.
// %[1]s: the pod template file, %[2]s: the namespace of action pods.
const realOpenWhiskConf = `include classpath("standalone-kcf.conf")
whisk {
  kubernetes {
    # the host reaches pod IPs on this node: no port forwarding through the API server
    port-forwarding-enabled = false
    action-namespace = "%[2]s"
    pod-template = "file:%[1]s"
    cpu-scaling { millicpus = 250, memory = 256 m, max-millicpus = 1000 }
  }
  # the runtime's own lines (one per activation) on stderr, read with kubectl logs: with the
  # LogDriverLogStore OpenWhisk does not collect action output into activations
  container-factory.container-args.extra-env-vars = ["__OW_ALLOW_CONCURRENT=true", "CPUSLOT_SOCKET=/run/cpuslot/agent.sock", "CPUSLOT_LOG=stderr"]
  # mycluster.yaml's action memory limits: the JVM runtime needs more than the 512 MB default maximum
  memory { min = 128 m, max = 4096 m, std = 1024 m }
  container-pool { pekko-client = true, user-memory = 2048 m }
  concurrency-limit { min = 1, max = 32, std = 1 }
  spi.LogStoreProvider = "org.apache.openwhisk.core.containerpool.logging.LogDriverLogStoreProvider"
}
`

// TestRealOpenWhisk: `wsk action create` with the cpu-quota annotation and
// `wsk action invoke --blocking` through a real controller and invoker; the
// KubernetesContainerFactory's action pod is served by the agent and the
// invocation runs in a slot of the annotation's quota (the runtime's
// activation log line), a CPU-bound one within its share.
func TestRealOpenWhisk(t *testing.T) {
	standalone, wsk := os.Getenv(envOpenWhiskStandalone), os.Getenv(envOpenWhiskWsk)
	if standalone == "" || wsk == "" {
		t.Skipf("%s and %s not set: build them from upstream checkouts with hack/openwhisk-build.sh (deploy/openwhisk/README.md)",
			envOpenWhiskStandalone, envOpenWhiskWsk)
	}
	for _, f := range []string{standalone, wsk} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("the OpenWhisk build is not there: %v", err)
		}
	}
	c := cluster.Need(t, kc)
	needRuntimeImage(t)
	repo, err := cluster.FindRepo(".")
	if err != nil {
		t.Fatal(err)
	}
	jar, err := cluster.SamplesJar(repo)
	if err != nil {
		t.Fatal(err)
	}
	const ns, appNS, release = "cpuslot-system", "e2e-openwhisk-real", "cpuslot"
	// /debug/pools answers the test's host: it checks which pools the agent keeps
	installChart(t, c, release, ns, "--set", "metrics.debugPoolsRemote=true")
	namespace(t, c, appNS)

	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tmpl, err := os.ReadFile(filepath.Join(repo, "deploy/openwhisk/kustomize/pod-template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	podTemplate := write("pod-template.yaml", string(tmpl))
	conf := write("standalone.conf", fmt.Sprintf(realOpenWhiskConf, podTemplate, appNS))
	manifest := write("runtimes.json", realOpenWhiskManifest)
	port := freePort(t)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	ow := startStandalone(ctx, t, c, standalone, dir, conf, manifest, port)
	api := "http://127.0.0.1:" + strconv.Itoa(port)
	w := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, wsk, append([]string{"--apihost", api, "--auth", openWhiskGuestKey}, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+dir, "WSK_CONFIG_FILE="+filepath.Join(dir, "wskprops"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// Java: the samples' CpuBurn, up to 4 activations at once in its
	// container; 768 MB gives its pod a CPU limit of 750m (cpu-scaling), the
	// agent's budget for 3 concurrent activations at 250m.
	create(t, w, ow, "burn", jar, "--kind", "java:cpuslot", "--main", "dev.cpuslot.samples.CpuBurn",
		"--memory", "768", "--concurrency", "4", "-a", "cpu-quota", "250m", "-a", "provide-api-key", "true")
	if out, err := w("action", "get", "burn"); err != nil || !strings.Contains(out, `"cpu-quota"`) {
		t.Fatalf("wsk action get: %v\n%s", err, out)
	}
	_, line := invokeCold(ctx, t, c, w, ow, appNS, "burn", "-p", "ms", "200")
	if line["quota"] != "250m" {
		t.Errorf("quota %s, want 250m (the action's cpu-quota annotation)", line["quota"])
	}

	// The action pod as the KubernetesContainerFactory made it, served by the agent.
	pod := actionPod(ctx, t, c, appNS, line["pod"])
	t.Logf("action pod %s: labels %v, cpu limit %s", pod.name, pod.labels, pod.cpuLimit)
	_, slots := waitServed(ctx, t, c, ns, appNS, pod.name, "user-action", 1)
	t.Logf("served: %d slots in its user-action container's cgroup", len(slots))
	if pod.labels["user-action-pod"] != "true" {
		t.Errorf("action pod labels %v: no user-action-pod=true", pod.labels)
	}

	// A CPU-bound invocation at 250m: its share of a CPU (cpu_ms / duration_ms
	// of its log line) not above 27.5 %.
	line = activationLine(ctx, t, c, appNS, invokeOK(t, w, ow, "burn", "-p", "ms", "3000").ID)
	cpu, _ := strconv.ParseFloat(line["cpu_ms"], 64)
	dur, _ := strconv.ParseFloat(line["duration_ms"], 64)
	if dur <= 0 {
		t.Fatalf("no duration in the activation's line: %v", line)
	}
	t.Logf("java: CPU-bound invocation at %s in slot %s: %.1f%% of a CPU", line["quota"], line["slot"], 100*cpu/dur)
	if cpu/dur > 0.275 {
		t.Errorf("%.1f%% of a CPU at 250m: above the cap", 100*cpu/dur)
	}

	// Intra-container concurrency: 3 blocking invocations at once overlap in
	// the one warm container, each in a slot.
	acts := make([]activation, 3)
	errs := make([]error, len(acts))
	var wg sync.WaitGroup
	for i := range acts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			acts[i], errs[i] = invoke(w, "burn", "-p", "ms", "3000")
		}()
	}
	wg.Wait()
	var lastStart, firstEnd int64 = 0, 1 << 62
	for i, a := range acts {
		if errs[i] != nil || !a.Response.Success {
			t.Fatalf("concurrent invocation %d: %v %s %s\n--- standalone log:\n%s", i, errs[i], a.Response.Status, a.Response.Result, ow.tail())
		}
		l := activationLine(ctx, t, c, appNS, a.ID)
		t.Logf("concurrent %d: activation %s %d..%d, pod %s slot %s quota %s", i, a.ID, a.Start, a.End, l["pod"], l["slot"], l["quota"])
		if l["pod"] != pod.name || l["slot"] == "none" {
			t.Errorf("concurrent activation %s ran in pod %s slot %s, want pod %s in a slot", a.ID, l["pod"], l["slot"], pod.name)
		}
		lastStart, firstEnd = max(lastStart, a.Start), min(firstEnd, a.End)
	}
	if lastStart >= firstEnd {
		t.Errorf("the 3 concurrent activations did not overlap (last start %d, first end %d)", lastStart, firstEnd)
	}

	// An /init failure (no such class): OpenWhisk reports the runtime's error
	// as the action developer's.
	create(t, w, ow, "broken", jar, "--kind", "java:cpuslot", "--main", "dev.cpuslot.samples.NoSuchClass",
		"--memory", "512", "-a", "cpu-quota", "250m", "-a", "provide-api-key", "true")
	a, err := invoke(w, "broken")
	t.Logf("init failure: %s: %v %s %s", a.ID, err, a.Response.Status, a.Response.Result)
	if a.Response.Success || a.Response.Status != "action developer error" || !strings.Contains(string(a.Response.Result), "NoSuchClass") {
		t.Errorf("an action whose /init fails: %v, status %q, result %s; want an action developer error naming the class", err, a.Response.Status, a.Response.Result)
	}

	// A timeout: 30 s of CPU in an action limited to 10 s. OpenWhisk answers
	// with its own message and removes the container; the agent, which
	// served its pod, then forgets it: no pool, no metric series, no slot.
	create(t, w, ow, "slow", jar, "--kind", "java:cpuslot", "--main", "dev.cpuslot.samples.CpuBurn",
		"--memory", "512", "--timeout", "10000", "-a", "cpu-quota", "250m", "-a", "provide-api-key", "true")
	slowDone := make(chan struct{})
	go func() {
		defer close(slowDone)
		a, err = invoke(w, "slow", "-p", "ms", "30000")
	}()
	slowPod := waitActionPod(ctx, t, c, appNS, "-guest-slow")
	slowInfo, _ := waitServed(ctx, t, c, ns, appNS, slowPod, "user-action", 1)
	if !hasPool(agentPools(ctx, t, c, ns), appNS+"/"+slowPod+"/") {
		t.Errorf("the agent has no pool for %s while it runs", slowPod)
	}
	select {
	case <-slowDone:
	case <-ctx.Done():
		t.Fatalf("wsk action invoke slow did not return:\n%s", ow.tail())
	}
	t.Logf("timeout: %s: %v %s %s, annotations %s", a.ID, err, a.Response.Status, a.Response.Result, a.Annotations)
	if a.Response.Status != "action developer error" || !strings.Contains(string(a.Response.Result), "exceeded its time limits") {
		t.Errorf("an activation past its time limit: %v, status %q, result %s; want OpenWhisk's time limit error", err, a.Response.Status, a.Response.Result)
	}
	waitNoPod(ctx, t, c, appNS, "-guest-slow")
	waitForgotten(ctx, t, c, ns, appNS, slowPod, slowInfo)

	// JavaScript and Python: the samples' fib, each in a slot of its quota.
	for _, k := range []struct{ action, file, kind string }{
		{"fibjs", "runtime-image/samples/src/main/js/fib.js", "nodejs:cpuslot"},
		{"fibpy", "runtime-image/samples/src/main/python/fib.py", "python:cpuslot"},
	} {
		create(t, w, ow, k.action, filepath.Join(repo, k.file), "--kind", k.kind,
			"--memory", "512", "--concurrency", "2", "-a", "cpu-quota", "250m", "-a", "provide-api-key", "true")
		a, l := invokeCold(ctx, t, c, w, ow, appNS, k.action, "-p", "n", "20")
		var r struct{ Fib int }
		json.Unmarshal(a.Response.Result, &r)
		t.Logf("%s (%s): %s, pod %s slot %s quota %s", k.action, k.kind, a.Response.Result, l["pod"], l["slot"], l["quota"])
		if r.Fib != 6765 || l["quota"] != "250m" {
			t.Errorf("%s: result %s quota %s, want fib 6765 at 250m", k.action, a.Response.Result, l["quota"])
		}
	}

	// The action pod deleted mid-invocation: whatever OpenWhisk answers for
	// that activation, the action runs again, in a new pod (a cold start)
	// and a slot of its annotation's quota.
	done := make(chan struct{})
	go func() {
		defer close(done)
		a, err := invoke(w, "burn", "-p", "ms", "20000")
		t.Logf("pod deleted mid-invocation: %s: %v %s %s", a.ID, err, a.Response.Status, a.Response.Result)
	}()
	time.Sleep(5 * time.Second) // the invocation under way
	if out, err := c.Kubectl(ctx, "-n", appNS, "delete", "pod", pod.name, "--wait=false"); err != nil {
		t.Fatalf("kubectl delete pod: %v %s", err, out)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("wsk action invoke did not return after its pod was deleted:\n%s", ow.tail())
	}
	deadline := time.Now().Add(5 * time.Minute)
	for i := 0; ; i++ {
		a, err := invoke(w, "burn", "-p", "ms", "200")
		if err == nil && a.Response.Success {
			l := activationLine(ctx, t, c, appNS, a.ID)
			t.Logf("after the deletion, invocation %d: %s in pod %s quota=%s source=%s slot=%s", i, a.ID, l["pod"], l["quota"], l["source"], l["slot"])
			if l["pod"] == pod.name {
				t.Errorf("activation %s ran in the deleted pod %s", a.ID, pod.name)
			}
			if l["source"] != "annotation" || l["slot"] == "none" {
				t.Errorf("activation %s, the new pod's first, ran at quota %s from %s in slot %s, want the annotation's in a slot", a.ID, l["quota"], l["source"], l["slot"])
			}
			break
		}
		t.Logf("after the deletion, invocation %d: %v %s %s", i, err, a.Response.Status, a.Response.Result)
		if time.Now().After(deadline) {
			t.Fatalf("burn did not run again within 5 min of its pod's deletion:\n%s", ow.tail())
		}
	}
}

// create runs `wsk action create`.
func create(t *testing.T, w func(...string) (string, error), ow *standaloneProc, name, file string, args ...string) {
	t.Helper()
	if out, err := w(append([]string{"action", "create", name, file}, args...)...); err != nil {
		t.Fatalf("wsk action create %s: %v\n%s\n--- standalone log:\n%s", name, err, out, ow.tail())
	}
}

// invokeCold invokes an action that has no container yet, once: that
// cold start's activation runs in a slot of the action's annotation's
// quota (the runtime's /init answers once it has read the annotation).
func invokeCold(ctx context.Context, t *testing.T, c *cluster.Cluster, w func(...string) (string, error), ow *standaloneProc,
	ns, name string, args ...string) (activation, hopLine) {
	t.Helper()
	a := invokeOK(t, w, ow, name, args...)
	line := activationLine(ctx, t, c, ns, a.ID)
	t.Logf("wsk action invoke %s (cold start): activation %s: pod %s quota=%s source=%s slot=%s, initTime %s ms",
		name, a.ID, line["pod"], line["quota"], line["source"], line["slot"], a.annotation("initTime"))
	if line["source"] != "annotation" || line["slot"] == "none" {
		t.Errorf("the cold start's activation %s of %s ran at quota %s from %s in slot %s, want the annotation's quota in a slot",
			a.ID, name, line["quota"], line["source"], line["slot"])
	}
	return a, line
}

// waitActionPod waits until an action pod whose name ends in suffix is
// Ready, and returns its name.
func waitActionPod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, suffix string) string {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, _ := c.Kubectl(ctx, "-n", ns, "get", "pods", "-l", "user-action-pod=true", "-o", "name")
		for _, n := range strings.Fields(out) {
			if name := strings.TrimPrefix(n, "pod/"); strings.HasSuffix(name, suffix) {
				if out, err := c.Kubectl(ctx, "-n", ns, "wait", "--for=condition=Ready", n, "--timeout=120s"); err != nil {
					t.Fatalf("action pod %s not Ready: %v %s", name, err, out)
				}
				return name
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no action pod *%s after 3 min: %s", suffix, out)
		}
		time.Sleep(time.Second)
	}
}

// agentURL is the agent pod's HTTP endpoint (the host reaches pod IPs).
func agentURL(ctx context.Context, t *testing.T, c *cluster.Cluster, agentNS string) string {
	t.Helper()
	ip, err := c.Kubectl(ctx, "-n", agentNS, "get", "pods", "-l", "app.kubernetes.io/name=cpuslot", "-o", "jsonpath={.items[0].status.podIP}")
	if err != nil || strings.TrimSpace(ip) == "" {
		t.Fatalf("the agent pod's IP: %v %q", err, ip)
	}
	return "http://" + net.JoinHostPort(strings.TrimSpace(ip), "9464")
}

// agentGet reads one of the agent's endpoints.
func agentGet(ctx context.Context, t *testing.T, c *cluster.Cluster, agentNS, path string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", agentURL(ctx, t, c, agentNS)+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("agent %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("agent %s: %s %s", path, resp.Status, b)
	}
	return string(b)
}

// agentPools is the names of the agent's pools (/debug/pools).
func agentPools(ctx context.Context, t *testing.T, c *cluster.Cluster, agentNS string) []string {
	t.Helper()
	var p struct {
		Pools []struct {
			Name string `json:"name"`
		} `json:"pools"`
	}
	out := agentGet(ctx, t, c, agentNS, "/debug/pools")
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("/debug/pools: %v: %s", err, out)
	}
	var names []string
	for _, x := range p.Pools {
		names = append(names, x.Name)
	}
	return names
}

func hasPool(names []string, prefix string) bool {
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}

// waitForgotten waits (at most 2 min) until the agent keeps nothing of a
// removed action pod: no pool (/debug/pools), no metric series labelled
// with it (/metrics), no slot cgroup left of its container.
func waitForgotten(ctx context.Context, t *testing.T, c *cluster.Cluster, agentNS, ns, pod string, p podInfo) {
	t.Helper()
	t0 := time.Now()
	cg := cluster.ContainerCgroupDir("cpu", p.QOS, p.UID, p.ContainerID)
	for {
		pools := agentPools(ctx, t, c, agentNS)
		var series []string
		for _, l := range strings.Split(agentGet(ctx, t, c, agentNS, "/metrics"), "\n") {
			if strings.Contains(l, `pod="`+pod+`"`) {
				series = append(series, l)
			}
		}
		slots, _ := filepath.Glob(filepath.Join(cg, "cpuslot-*"))
		if !hasPool(pools, ns+"/"+pod+"/") && len(series) == 0 && len(slots) == 0 {
			t.Logf("the agent forgot the removed pod %s %v after it was gone: no pool, no series, no slot", pod, time.Since(t0).Round(time.Millisecond))
			return
		}
		if time.Since(t0) > 2*time.Minute {
			logs, _ := c.Kubectl(ctx, "-n", agentNS, "logs", "-l", "app.kubernetes.io/name=cpuslot", "--tail=40")
			t.Fatalf("2 min after the removal of %s the agent still has: pools %v; series %v; slots %v\n--- agent log:\n%s", pod, pools, series, slots, logs)
		}
		time.Sleep(time.Second)
	}
}

// waitNoPod waits until no action pod's name ends in suffix.
func waitNoPod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, suffix string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, err := c.Kubectl(ctx, "-n", ns, "get", "pods", "-l", "user-action-pod=true", "-o", "name")
		if err == nil && !strings.Contains(out+"\n", suffix+"\n") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the action pod *%s is still there after 3 min: %v\n%s", suffix, err, out)
		}
		time.Sleep(2 * time.Second)
	}
}

type standaloneProc struct {
	mu  sync.Mutex
	log []string
}

func (p *standaloneProc) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.log)
	if n > 80 {
		n = 80
	}
	return strings.Join(p.log[len(p.log)-n:], "\n")
}

// startStandalone starts OpenWhisk standalone with the KubernetesContainerFactory
// on the cluster and waits until its API answers.
func startStandalone(ctx context.Context, t *testing.T, c *cluster.Cluster, bin, dir, conf, manifest string, port int) *standaloneProc {
	t.Helper()
	cmd := exec.Command(bin, "--dev-kcf", "--dev-mode", "--no-ui", "--no-browser", "--disable-color-logging",
		"--config-file", conf, "--manifest", manifest, "--port", strconv.Itoa(port), "--data-dir", filepath.Join(dir, "data"))
	ip := c.NodeIP()
	// the address action pods reach the API at (__OW_API_HOST), without
	// standalone's Docker-based detection; the API on every address (the
	// host's loopback for wsk, the node's for action pods): standalone sets
	// whisk.controller.interface to the host name as a system property,
	// over any configuration file, unless that property is given
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig(),
		"JAVA_OPTS=-Dwhisk.standalone.host.ip="+ip+" -Dwhisk.standalone.host.name="+ip+" -Dwhisk.standalone.host.internal="+ip+
			" -Dwhisk.controller.interface=0.0.0.0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &standaloneProc{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s := bufio.NewScanner(out)
		s.Buffer(make([]byte, 64<<10), 1<<20)
		for s.Scan() {
			p.mu.Lock()
			p.log = append(p.log, s.Text())
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
		}
		cmd.Wait()
		if t.Failed() {
			t.Logf("--- standalone log (last lines):\n%s", p.tail())
		}
	})
	deadline := time.Now().Add(5 * time.Minute)
	for {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			conn.Close()
			return p
		}
		select {
		case <-done:
			t.Fatalf("OpenWhisk standalone exited before its API answered:\n%s", p.tail())
		case <-ctx.Done():
			t.Fatalf("OpenWhisk standalone: %v", ctx.Err())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("OpenWhisk standalone's API did not answer on port %d within 5 min:\n%s", port, p.tail())
		}
		time.Sleep(time.Second)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// activation is what `wsk action invoke --blocking` prints.
type activation struct {
	ID          string `json:"activationId"`
	Start       int64  `json:"start"`
	End         int64  `json:"end"`
	Annotations json.RawMessage
	Response    struct {
		Status  string          `json:"status"`
		Success bool            `json:"success"`
		Result  json.RawMessage `json:"result"`
	} `json:"response"`
}

// annotation is one of the activation's annotations, as JSON ("" when absent).
func (a activation) annotation(key string) string {
	var kv []struct {
		Key   string          `json:"key"`
		Value json.RawMessage `json:"value"`
	}
	json.Unmarshal(a.Annotations, &kv)
	for _, x := range kv {
		if x.Key == key {
			return string(x.Value)
		}
	}
	return ""
}

// invoke runs `wsk action invoke --blocking`: the activation, also of a
// failed invocation (wsk then exits non-zero and prints it all the same);
// an error without one.
func invoke(w func(...string) (string, error), name string, args ...string) (activation, error) {
	out, err := w(append([]string{"action", "invoke", name, "--blocking"}, args...)...)
	// "ok: invoked /_/NAME with id ID" and the activation as JSON; past
	// the controller's blocking wait (60 s: a cold start on a busy machine)
	// only "... has not yet finished, with id ID": then the activation
	// record is read once it is there.
	if _, id, ok := strings.Cut(out, "has not yet finished, with id "); ok && !strings.Contains(out, "{") {
		id = strings.TrimSpace(id)
		for i := 0; i < 60 && !strings.Contains(out, "{"); i++ {
			time.Sleep(5 * time.Second)
			out, err = w("activation", "get", id)
		}
	}
	var a activation
	i := strings.Index(out, "{")
	if i < 0 || json.Unmarshal([]byte(out[i:]), &a) != nil || a.ID == "" {
		return a, fmt.Errorf("wsk action invoke %s: %v, no activation in its output:\n%s", name, err, out)
	}
	return a, err
}

// invokeOK invokes, failing the test unless the action succeeded.
func invokeOK(t *testing.T, w func(...string) (string, error), ow *standaloneProc, name string, args ...string) activation {
	t.Helper()
	a, err := invoke(w, name, args...)
	if err != nil || !a.Response.Success {
		t.Fatalf("wsk action invoke %s: %v %s %s\n--- standalone log:\n%s", name, err, a.Response.Status, a.Response.Result, ow.tail())
	}
	return a
}

// activationLine is the runtime's log line for an activation
// ("cpuslot: activation=ID ... quota=... source=... slot=..."), from the
// action pods' logs, with the pod's name as "pod"; it is written after the
// reply, so it is waited for.
func activationLine(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, id string) hopLine {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		logs, _ := c.Kubectl(ctx, "-n", ns, "logs", "-l", "user-action-pod=true", "-c", "user-action", "--tail=-1",
			"--prefix", "--max-log-requests=20", "--ignore-errors")
		for _, l := range strings.Split(logs, "\n") {
			// "[pod/NAME/user-action] cpuslot: activation=ID ..."
			prefix, rest, ok := strings.Cut(l, "cpuslot: activation="+id+" ")
			if !ok {
				continue
			}
			h := hopLine{"activation": id}
			if p, ok := strings.CutPrefix(strings.TrimSpace(prefix), "[pod/"); ok {
				h["pod"], _, _ = strings.Cut(p, "/")
			}
			for _, f := range strings.Fields(rest) {
				if k, v, ok := strings.Cut(f, "="); ok {
					if _, seen := h[k]; !seen {
						h[k] = v
					}
				}
			}
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line for activation %s in the action pods' logs after 2 min:\n%s", id, logs)
		}
		time.Sleep(time.Second)
	}
}

type actionPodInfo struct {
	name     string
	labels   map[string]string
	cpuLimit string
}

// actionPod is the action pod name as the invoker made it.
func actionPod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string) actionPodInfo {
	t.Helper()
	out, err := c.Kubectl(ctx, "-n", ns, "get", "pods", name, "-o", "json")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var p struct {
		Metadata struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			Containers []struct {
				Name      string `json:"name"`
				Resources struct {
					Limits map[string]string `json:"limits"`
				} `json:"resources"`
			} `json:"containers"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatal(err)
	}
	info := actionPodInfo{name: p.Metadata.Name, labels: p.Metadata.Labels}
	for _, ctr := range p.Spec.Containers {
		if ctr.Name == "user-action" {
			info.cpuLimit = ctr.Resources.Limits["cpu"]
		}
	}
	return info
}
