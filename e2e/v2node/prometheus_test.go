package v2node

import (
	"context"
	"encoding/base64"
	"fmt"
	"path"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// The guest's Prometheus: the host's Debian binary (the guest runs the
// host's userland) as a transient systemd unit, its files and data on the
// guest's tmpfs. It runs in the guest because pod IPs are routed only
// there (the host reaches the guest through forwarded ports alone), so the
// shipped file_sd configuration scrapes <pod IP>:port there as it would on
// any node; the host queries it through PrometheusPort.
const (
	promUnit = "v2node-prometheus.service"
	promDir  = stateDir + "/prometheus"
)

// guestProm is a Prometheus running in the guest.
type guestProm struct {
	cluster.Prometheus
	n *Node
}

// startGuestPrometheus writes the shipped file_sd configuration (5 s
// intervals: a scrape's timeout is its interval, and the Java runtime's
// page on the emulated node, under a host busy with the legacy node's
// e2e, took longer than 2 s for two minutes in a CI run), the chart's rules and the targets of the pods running now
// into the guest, starts Prometheus there and waits until it is ready.
// It is stopped, and its data removed, when the test ends.
func startGuestPrometheus(t *testing.T, ctx context.Context, n *Node) *guestProm {
	t.Helper()
	config, rules, err := cluster.PrometheusConfig(n.RepoDir(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p := &guestProm{Prometheus: cluster.Prometheus{Base: n.PrometheusURL()}, n: n}
	guest(t, ctx, n, fmt.Sprintf("mkdir -p %[1]s/data %[1]s/cpuslot-targets", promDir))
	p.writeFile(t, ctx, "prometheus.yml", config)
	p.writeFile(t, ctx, "cpuslot-rules.yml", rules)
	p.writeTargets(t, ctx)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if out, err := n.MustExec(ctx, fmt.Sprintf("systemctl stop %s; systemctl reset-failed %[1]s 2>/dev/null; rm -rf %s", promUnit, promDir)); err != nil {
			t.Errorf("stopping the guest's Prometheus: %v: %s", err, out)
		}
	})
	// DefaultDependencies=no, as the node's own units: the guest boots to
	// v2node.target, not to basic.target.
	guest(t, ctx, n, fmt.Sprintf(`systemd-run --unit=%s -p DefaultDependencies=no \
	-p StandardOutput=append:%[2]s/prometheus.log -p StandardError=append:%[2]s/prometheus.log \
	/usr/bin/prometheus --config.file=%[3]s/prometheus.yml --storage.tsdb.path=%[3]s/data \
	--web.listen-address=:%[4]d --log.level=warn`, promUnit, logDir, promDir, PrometheusPort))
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := p.WaitReady(rctx); err != nil {
		t.Fatalf("%v\n%s", err, guest(t, ctx, n, fmt.Sprintf("systemctl --no-pager status %s; tail -n 30 %s/prometheus.log", promUnit, logDir)))
	}
	return p
}

// writeFile writes one of Prometheus's files in the guest, atomically
// (Prometheus re-reads the targets files when they change).
func (p *guestProm) writeFile(t *testing.T, ctx context.Context, name string, b []byte) {
	t.Helper()
	f := path.Join(promDir, name)
	tmp := path.Join(path.Dir(f), "."+path.Base(f))
	guest(t, ctx, p.n, fmt.Sprintf("echo %s | base64 -d > %s && mv %s %s", base64.StdEncoding.EncodeToString(b), tmp, tmp, f))
}

// writeTargets writes the targets files (cluster.TargetFiles) of the pods
// running now.
func (p *guestProm) writeTargets(t *testing.T, ctx context.Context) {
	t.Helper()
	files, err := cluster.PodTargetFiles(ctx, p.n.Kubectl)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		p.writeFile(t, ctx, path.Join("cpuslot-targets", name), b)
	}
}

// prometheusQueries: a real Prometheus with the shipped file_sd
// configuration and the chart's rules scrapes the agent on this node and
// the served pods; the agent's series of fn (invoking through its slots)
// appear; every query of the chart's dashboards and alerts evaluates, and
// every one expected to return data ("data", "budget") does: all of the
// agent's, and the runtime dashboard's (job cpuslot-runtime: the Java
// runtime's own series, from the pods JavaRuntimePods leaves running with a
// light load; fn is the Go probe, which exports none). Each query's result
// is logged.
func (f *served) prometheusQueries(t *testing.T) {
	ctx := f.ctx(t, 6*time.Minute)
	t0 := time.Now()
	p := startGuestPrometheus(t, ctx, f.n)
	t.Logf("Prometheus ready in the guest %v after the step began", time.Since(t0).Round(time.Second))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(p.WaitSeries(ctx, `up{job="cpuslot-node-agent", node="`+NodeName+`"} == 1`, 2*time.Minute))
	must(p.WaitSeries(ctx, `cpuslot_slots{job="cpuslot-node-agent", namespace="default", pod="`+f.pod+`", container="fn"}`, time.Minute))
	must(p.WaitSeries(ctx, `sum(rate(cpuslot_lease_releases_total{job="cpuslot-node-agent", action!="_hold"}[1m])) > 0`, time.Minute))
	t.Logf("the agent's series of %s %v after the step began", f.pod, time.Since(t0).Round(time.Second))

	rules, bad, err := p.RuleGroups(ctx)
	must(err)
	if rules == 0 || len(bad) > 0 {
		t.Errorf("the chart's rules: %d loaded, failing: %v", rules, bad)
	}
	// While the Java runtime pods of JavaRuntimePods run, their targets
	// must be up and every runtime-side query must return data too.
	if f.java {
		if err := p.WaitSeries(ctx, `count(up{job="cpuslot-runtime"} == 1) >= 1`, 2*time.Minute); err != nil {
			t.Fatalf("%v\n%s", err, f.javaPodsState(t, ctx))
		}
		must(p.WaitSeries(ctx, `sum(rate(cpuslot_invocations_total{job="cpuslot-runtime"}[1m])) > 0`, 2*time.Minute))
	}
	runtimes, err := p.Query(ctx, `up{job="cpuslot-runtime"} == 1`)
	must(err)
	qs, err := cluster.ShippedQueries(f.n.RepoDir())
	must(err)
	want := func(q cluster.ShippedQuery) bool {
		return (q.Expect == "data" || q.Expect == "budget") && (f.java || !q.RuntimeSide())
	}
	got, err := p.EvalQueries(ctx, qs, want, 90*time.Second)
	must(err)
	// What returned data, and what did not and why.
	var data, none []string
	why := map[string]string{
		"error":  "counts errors, bad requests or refusals: none happened",
		"alert":  "an alert expression: series only while it fires",
		"budget": "needs a CPU budget",
		"data":   "",
	}
	for i, q := range qs {
		if got[i] > 0 {
			data = append(data, q.Source)
			continue
		}
		reason := why[q.Expect]
		if want(q) {
			reason = "EXPECTED DATA"
			t.Errorf("%s returns no data: %s", q.Source, q.Query)
		} else if q.RuntimeSide() && q.Expect != "error" && q.Expect != "alert" {
			reason = "the Java runtime's series: no Java runtime pod ran (JavaRuntimePods failed)"
		}
		none = append(none, q.Source+" ("+reason+")")
	}
	sort.Strings(data)
	t.Logf("%d shipped queries evaluate, %d rules loaded; %d runtime target(s) up", len(qs), rules, runtimes)
	t.Logf("%d returned data: %s", len(data), strings.Join(data, " "))
	t.Logf("%d returned none:\n  %s", len(none), strings.Join(none, "\n  "))
	t.Logf("step took %v", time.Since(t0).Round(time.Second))
}

// javaPodsState says why the Java runtime pods' metrics are not scraped:
// the pods (IPs, restarts, last state), each one's metrics port from the
// guest, and its last log lines.
func (f *served) javaPodsState(t *testing.T, ctx context.Context) string {
	var b strings.Builder
	out, _ := f.n.Kubectl(ctx, "get", "pods", "-o", "wide")
	b.WriteString(out)
	for _, c := range []struct{ pod, container string }{{owPod, "user-action"}, {knPod, "user-container"}} {
		st, _ := f.n.Kubectl(ctx, "get", "pod", c.pod, "-o", "jsonpath={.status.containerStatuses}")
		fmt.Fprintf(&b, "--- %s: %s\n", c.pod, st)
		ip := podIPOf(t, ctx, f.n, c.pod)
		fmt.Fprintf(&b, "metrics: %s\n", guest(t, ctx, f.n, "curl -sS -m 20 -o /dev/null -w '%{http_code} in %{time_total}s' http://"+ip+":9102/metrics 2>&1; true"))
		logs, _ := f.n.Kubectl(ctx, "logs", c.pod, "-c", c.container, "--tail=30")
		b.WriteString(logs)
		prev, _ := f.n.Kubectl(ctx, "logs", c.pod, "-c", c.container, "--previous", "--tail=30")
		if prev != "" {
			fmt.Fprintf(&b, "--- previous container:\n%s", prev)
		}
	}
	return b.String()
}
