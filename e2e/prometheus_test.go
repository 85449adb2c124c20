package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
	base string
	dir  string
	c    *cluster.Cluster
}

const promAddr = "127.0.0.1:19090"

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
	src, err := os.ReadFile(filepath.Join(repo, "deploy", "prometheus", "prometheus-file-sd.yml"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(filepath.Join(repo, "deploy", "prometheus", "cpuslot-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	// Scrape and evaluate every 2 s so that the test need not wait long.
	var out []string
	for _, line := range strings.Split(string(src), "\n") {
		trim := strings.TrimSpace(line)
		if strings.HasPrefix(trim, "scrape_interval:") || strings.HasPrefix(trim, "evaluation_interval:") {
			line = line[:len(line)-len(trim)] + strings.SplitN(trim, ":", 2)[0] + ": 2s"
		}
		out = append(out, line)
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(strings.Join(out, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpuslot-rules.yml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	p := &prom{base: "http://" + promAddr, dir: dir, c: c}
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
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(c.LogDir(), "prometheus.log"))
			t.Fatalf("prometheus not ready after 30 s (%v); its log:\n%s", err, log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return p
}

type fileSDGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// writeTargets writes the file_sd targets: the chart's agent pods
// (<pod IP>:9464) and the running runtime pods (OpenWhisk action pods,
// Knative revision pods, pods annotated cpuslot.dev/enabled=true;
// <pod IP>:9102 or the prometheus.io/port annotation), as
// deploy/prometheus/prometheus.yml selects them. Call it again when pods
// change.
func (p *prom) writeTargets(ctx context.Context, t *testing.T) {
	t.Helper()
	out, err := p.c.Kubectl(ctx, "get", "pods", "-A", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var pods struct {
		Items []struct {
			Metadata struct {
				Name        string            `json:"name"`
				Namespace   string            `json:"namespace"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec struct {
				NodeName string `json:"nodeName"`
			} `json:"spec"`
			Status struct {
				Phase string `json:"phase"`
				PodIP string `json:"podIP"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &pods); err != nil {
		t.Fatal(err)
	}
	agents, runtimes := []fileSDGroup{}, []fileSDGroup{}
	for _, pod := range pods.Items {
		m := pod.Metadata
		if pod.Status.PodIP == "" || pod.Status.Phase != "Running" {
			continue
		}
		labels := map[string]string{"namespace": m.Namespace, "pod": m.Name, "node": pod.Spec.NodeName}
		switch {
		case m.Labels["app.kubernetes.io/name"] == "cpuslot" && m.Labels["app.kubernetes.io/component"] == "node-agent":
			agents = append(agents, fileSDGroup{[]string{pod.Status.PodIP + ":9464"}, labels})
		case m.Annotations["cpuslot.dev/enabled"] == "false":
		case m.Labels["user-action-pod"] == "true" || m.Labels["serving.knative.dev/revision"] != "" || m.Annotations["cpuslot.dev/enabled"] == "true":
			port := "9102"
			if v := m.Annotations["prometheus.io/port"]; v != "" {
				port = v
			}
			runtimes = append(runtimes, fileSDGroup{[]string{pod.Status.PodIP + ":" + port}, labels})
		}
	}
	for name, groups := range map[string][]fileSDGroup{"node-agent.json": agents, "runtime.json": runtimes} {
		b, _ := json.Marshal(groups)
		tmp := filepath.Join(p.dir, "cpuslot-targets", "."+name)
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(p.dir, "cpuslot-targets", name)); err != nil {
			t.Fatal(err)
		}
	}
}

// query runs an instant query and returns the number of series (or
// samples) in its result.
func (p *prom) query(ctx context.Context, q string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", p.base+"/api/v1/query?query="+url.QueryEscape(q), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("query %q: %s", q, r.Error)
	}
	if r.Data.ResultType == "scalar" || r.Data.ResultType == "string" {
		return 1, nil
	}
	var series []json.RawMessage
	if err := json.Unmarshal(r.Data.Result, &series); err != nil {
		return 0, err
	}
	return len(series), nil
}

// waitSeries waits until q returns at least one series.
func (p *prom) waitSeries(ctx context.Context, t *testing.T, q string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n, err := p.query(ctx, q)
		if err == nil && n > 0 {
			return
		}
		if time.Now().After(deadline) {
			targets := ""
			if resp, herr := http.Get(p.base + "/api/v1/targets?state=active"); herr == nil {
				var b strings.Builder
				bufio.NewReader(resp.Body).WriteTo(&b)
				resp.Body.Close()
				targets = b.String()
			}
			t.Fatalf("%s: no series after %v (%v)\n--- targets:\n%s", q, timeout, err, targets)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

type shippedQuery struct {
	source, expect, query string
}

// shippedQueries reads charts/cpuslot/queries.txt: every PromQL query of
// the chart's dashboards and alert rules.
func shippedQueries(t *testing.T) []shippedQuery {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir(t), "queries.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var qs []shippedQuery
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 {
			t.Fatalf("queries.txt: bad line %q", line)
		}
		qs = append(qs, shippedQuery{f[0], f[1], f[2]})
	}
	return qs
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
	p.waitSeries(ctx, t, `cpuslot_slots{job="cpuslot-node-agent", container="`+appNS+`/fn/fn"}`, 30*time.Second)
	p.waitSeries(ctx, t, `cpuslot_agent_info{job="cpuslot-node-agent", node="`+c.NodeName()+`"}`, 30*time.Second)
	// The pod invokes through its slots: its client leases them locally
	// (the agent sees a HOLD acquisition per miss only) and reports its
	// invocations in USAGE, which the agent counts as released leases.
	p.waitSeries(ctx, t, `sum(rate(cpuslot_lease_releases_total{job="cpuslot-node-agent", action!="_held"}[1m])) > 0`, 60*time.Second)

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
		"code": base64.StdEncoding.EncodeToString(jar),
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
	qs := shippedQueries(t)
	var empty []string
	deadline := time.Now().Add(90 * time.Second)
	for {
		empty = empty[:0]
		for _, q := range qs {
			got, err := p.query(ctx, q.query)
			if err != nil {
				t.Fatalf("%s: %v", q.source, err)
			}
			if got == 0 && (q.expect == "data" || q.expect == "budget") {
				empty = append(empty, q.source+"\t"+q.query)
			}
		}
		if len(empty) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if len(empty) > 0 {
		t.Errorf("%d shipped queries return no data:\n  %s", len(empty), strings.Join(empty, "\n  "))
	} else {
		t.Logf("all %d shipped queries evaluate; every \"data\" and \"budget\" one returns data", len(qs))
	}
}
