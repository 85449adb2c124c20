package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// prom is a real Prometheus (Debian's package) started by a test on the
// host with deploy/prometheus/prometheus-file-sd.yml: Debian builds
// Prometheus without Kubernetes service discovery, so the harness writes
// the targets files (agent pods, runtime pods) from the API, with the
// labels the Kubernetes variant adds; pod IPs are routed by the CNI bridge.
type prom struct {
	cluster.Prometheus
	dir string
	c   *cluster.Cluster
}

const promAddr = "127.0.0.1:19090"

// promInterval is the test Prometheus's scrape and evaluation interval:
// short, so that the test need not wait long.
const promInterval = 2 * time.Second

func startPrometheus(t *testing.T, c *cluster.Cluster) *prom {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not installed (hack/e2e-deps.sh installs it): %v", err)
	}
	repo, err := cluster.FindRepo(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(c.RunDir(), "prometheus")
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "cpuslot-targets"), 0o755); err != nil {
		t.Fatal(err)
	}
	config, rules, err := cluster.PrometheusConfig(repo, promInterval)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, config, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpuslot-rules.yml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	p := &prom{Prometheus: cluster.Prometheus{Base: "http://" + promAddr}, dir: dir, c: c}
	p.writeTargets(context.Background(), t)
	stop, err := c.Start("prometheus", bin,
		"--config.file="+cfg,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr,
		"--log.level=warn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitReady(ctx); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.LogDir(), "prometheus.log"))
		t.Fatalf("%v; its log:\n%s", err, log)
	}
	return p
}

// writeTargets writes the file_sd targets (cluster.TargetFiles) of the
// pods running now. Call it again when pods change.
func (p *prom) writeTargets(ctx context.Context, t *testing.T) {
	t.Helper()
	files, err := cluster.PodTargetFiles(ctx, p.c.Kubectl)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		tmp := filepath.Join(p.dir, "cpuslot-targets", "."+name)
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(p.dir, "cpuslot-targets", name)); err != nil {
			t.Fatal(err)
		}
	}
}

// waitSeries waits until q returns at least one series.
func (p *prom) waitSeries(ctx context.Context, t *testing.T, q string, timeout time.Duration) {
	t.Helper()
	if err := p.WaitSeries(ctx, q, timeout); err != nil {
		t.Fatal(err)
	}
}

// TestPrometheusScrapesAgent: a real Prometheus with the shipped scrape
// configuration (file_sd variant) scrapes the agent of a helm-installed
// chart;
// the agent's series of a served pod that invokes through its slots (the
// probe's Go client) appear; with a runtime pod (Java runtime image)
// running invocations too, every query of the shipped dashboards and alert
// rules evaluates and each one expected to return data does.
func TestPrometheusScrapesAgent(t *testing.T) {
	c := cluster.Need(t, kc)
	const ns, appNS, release = "cpuslot-system", "e2e-prom", "cpuslot"
	p := startPrometheus(t, c)
	installChart(t, c, release, ns)
	namespace(t, c, appNS)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := c.Apply(ctx, fmt.Sprintf(annotatedPod, "fn", appNS, cluster.ProbeImage, `["slots", "-threads", "2", "-pause", "5ms"]`)); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := c.Kubectl(ctx, "-n", appNS, "wait", "--for=condition=Ready", "pod/fn", "--timeout=90s"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitServed(ctx, t, c, ns, appNS, "fn", "fn", 3)
	p.writeTargets(ctx, t)

	t0 := time.Now()
	p.waitSeries(ctx, t, `up{job="cpuslot-node-agent"} == 1`, 60*time.Second)
	t.Logf("Prometheus scrapes the agent %v after the pod was served", time.Since(t0).Round(time.Millisecond))
	// A served container's series carry its namespace, pod and container
	// name apart (the scrape honors them over the agent pod's own), as
	// cAdvisor's do; the combined name stays as cpuslot_container for one
	// release.
	fn := `namespace="` + appNS + `", pod="fn", container="fn"`
	p.waitSeries(ctx, t, `cpuslot_slots{job="cpuslot-node-agent", `+fn+`, cpuslot_container="`+appNS+`/fn/fn"}`, 30*time.Second)
	p.waitSeries(ctx, t, `cpuslot_agent_info{job="cpuslot-node-agent", node="`+c.NodeName()+`"}`, 30*time.Second)
	p.waitSeries(ctx, t, `cpuslot_build_info{job="cpuslot-node-agent", node="`+c.NodeName()+`", version!=""}`, 30*time.Second)
	// Base units: a served container's budget in CPUs is its millicores / 1000.
	p.waitSeries(ctx, t, `abs(cpuslot_budget_cores{job="cpuslot-node-agent", `+fn+`} * 1000 - on(namespace, pod, container) cpuslot_budget_millicores{job="cpuslot-node-agent", `+fn+`}) < 0.001`, 30*time.Second)
	// The pod invokes through its slots: its client leases them locally
	// (the agent sees a HOLD acquisition per miss only) and reports its
	// invocations in USAGE, which the agent counts as released leases.
	p.waitSeries(ctx, t, `sum(rate(cpuslot_lease_releases_total{job="cpuslot-node-agent", action!="_hold"}[1m])) > 0`, 60*time.Second)

	// A runtime pod (the Java runtime image) running invocations in
	// slots: the runtime's own series, for the runtime dashboard.
	needRuntimeImage(t)
	jar := samplesJar(t)
	// Room on the 2-core node for the runtime pod's CPU request.
	if out, err := c.Kubectl(ctx, "-n", appNS, "delete", "pod", "fn", "--wait=true"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// An OpenWhisk action pod: its runtime looks the quota up in the
	// (stand-in) OpenWhisk API, which the runtime dashboard counts.
	api := startFakeOpenWhiskAPI(t, c)
	api.quota["cpuburn"] = "250m"
	const owpod = "wskowdev-invoker-00-1-guest-cpuburn"
	if out, err := c.Apply(ctx, fmt.Sprintf(openWhiskActionPod, appNS, runtimeImage, api.url)); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := c.Kubectl(ctx, "-n", appNS, "wait", "--for=condition=Ready", "pod/"+owpod, "--timeout=120s"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	owbase := "http://" + podIP(ctx, t, c, appNS, owpod) + ":8080"
	waitHTTP(ctx, t, owbase+"/")
	if r, err := post(ctx, owbase+"/init", map[string]any{"value": map[string]any{
		"name": "cpuburn", "main": "dev.cpuslot.samples.CpuBurn", "binary": true,
		"code": base64.StdEncoding.EncodeToString(jar), "env": invokerInitEnv(api.apiKey, "cpuburn", nil),
	}}); err != nil || r.status != 200 {
		t.Fatalf("/init: %v %d", err, r.status)
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	go func() {
		for i := 0; loadCtx.Err() == nil; i++ {
			post(loadCtx, owbase+"/run", map[string]any{
				"value": map[string]any{"ms": 20, "threads": 1}, "namespace": "guest",
				"action_name": "/guest/cpuburn", "action_version": "0.0.1",
				"activation_id": fmt.Sprintf("ow%029d", i), "transaction_id": fmt.Sprintf("tid%d", i),
				"deadline": strconv.FormatInt(time.Now().Add(60*time.Second).UnixMilli(), 10),
				"api_key":  api.apiKey,
			})
			time.Sleep(20 * time.Millisecond)
		}
	}()
	p.writeTargets(ctx, t)
	p.waitSeries(ctx, t, `up{job="cpuslot-runtime"} == 1`, 60*time.Second)

	// Every query of the shipped dashboards and alerts evaluates; every one
	// expected to return data once an agent serves a pod whose runtime runs
	// invocations with slots (and those that need a CPU budget: the pods
	// have CPU limits) does.
	repo, err := cluster.FindRepo(".")
	if err != nil {
		t.Fatal(err)
	}
	qs, err := cluster.ShippedQueries(repo)
	if err != nil {
		t.Fatal(err)
	}
	want := func(q cluster.ShippedQuery) bool { return q.Expect == "data" || q.Expect == "budget" }
	got, err := p.EvalQueries(ctx, qs, want, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var empty []string
	for i, q := range qs {
		if got[i] == 0 && want(q) {
			empty = append(empty, q.Source+"\t"+q.Query)
		}
	}
	if len(empty) > 0 {
		t.Errorf("%d shipped queries return no data:\n  %s", len(empty), strings.Join(empty, "\n  "))
	} else {
		t.Logf("all %d shipped queries evaluate; every \"data\" and \"budget\" one returns data", len(qs))
	}

	// The Perses dashboards drawn in a browser while the runtime invokes.
	if os.Getenv("CPUSLOT_E2E_DASHBOARDS") == "0" {
		t.Log("dashboards not drawn: CPUSLOT_E2E_DASHBOARDS=0")
		return
	}
	drawDashboards(t, repo, p.Base, promInterval)
}

// drawDashboards draws both Perses dashboards against the Prometheus at
// base, which scrapes every interval, with the page of
// tools/dashboards/view in headless Chromium and writes a screenshot of
// each to the artifacts directory ($CPUSLOT_E2E_ARTIFACTS, default
// <repo>/bin/e2e-artifacts). shots.mjs fails when a panel shows an error,
// or no data where queries.txt expects some (naming each such panel with
// its queries as run), and names the panels still loading when its wait
// runs out.
//
// Only on the legacy node, whose Prometheus runs on this machine: what
// the drawing adds to the queries checked on both node kinds (Perses's
// variables, time ranges and plugins) does not depend on the node, and the
// emulated v2 node already keeps the CPU busy.
func drawDashboards(t *testing.T, repo, base string, interval time.Duration) {
	t.Helper()
	view := filepath.Join(repo, "tools", "dashboards", "view")
	if _, err := os.Stat(filepath.Join(view, "dist", "index.html")); err != nil {
		t.Fatalf("the dashboard page is not built (hack/dashboard-view.sh, run by make e2e-deps): %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node (>= 20.19) is needed to draw the dashboards: %v", err)
	}
	out := os.Getenv("CPUSLOT_E2E_ARTIFACTS")
	if out == "" {
		out = filepath.Join(repo, "bin", "e2e-artifacts")
	}
	// shots.mjs waits at most 100 s per dashboard for its panels and ends
	// itself after 7 min (naming what it was doing); this context is the
	// backstop should node itself hang.
	const deadline = 7 * time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), deadline+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "shots.mjs", "--prometheus", base, "--out", out,
		"--scrape-interval", interval.String(), "--start", "5m", "--timeout", "100",
		"--deadline", strconv.Itoa(int(deadline.Seconds())))
	cmd.Dir = view
	// Chromium's processes are node's children: stop the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	t0 := time.Now()
	b, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("drawing the dashboards took longer than %v (shots.mjs did not end itself); its output:\n%s", deadline+time.Minute, b)
	}
	if err != nil {
		t.Fatalf("the dashboards drawn against the live Prometheus: %v:\n%s", err, b)
	}
	t.Logf("dashboards drawn in %v, screenshots in %s:\n%s", time.Since(t0).Round(time.Second), out, b)
}
