// The chart's queries: every PromQL query of the dashboards and alert
// rules against the metrics the code exports (TestQueries, TestPromtool),
// and the dashboards as the chart renders them (TestPersesDashboards).
package chart

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// ---------------------------------------------------------------- queries

// Known metrics, read from the code that exports them.
type metricSet struct{ names, histograms map[string]bool }

func (m metricSet) has(name string) bool {
	if m.names[name] {
		return true
	}
	for _, suf := range []string{"_bucket", "_count", "_sum"} {
		if b, ok := strings.CutSuffix(name, suf); ok && m.histograms[b] {
			return true
		}
	}
	return false
}

func scan(t *testing.T, root, ext string, each func(path, src string)) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "target" {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ext) && !strings.HasSuffix(p, "_test.go") {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			each(p, string(b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func agentMetrics(t *testing.T) metricSet {
	m := metricSet{map[string]bool{"up": true}, map[string]bool{}}
	name := regexp.MustCompile(`(?:Name:\s*|NewDesc\()"(cpuslot_\w+)"`)
	hist := regexp.MustCompile(`NewHistogram(?:Vec)?\(prometheus\.HistogramOpts\{\s*Name:\s*"(cpuslot_\w+)"`)
	scan(t, filepath.Join(repoRoot, "internal"), ".go", func(_, src string) {
		for _, s := range name.FindAllStringSubmatch(src, -1) {
			m.names[s[1]] = true
		}
		for _, s := range hist.FindAllStringSubmatch(src, -1) {
			m.histograms[s[1]] = true
		}
		if strings.Contains(src, "NewProcessCollector(") {
			m.names["process_start_time_seconds"] = true
		}
	})
	if len(m.names) < 10 || len(m.histograms) < 3 {
		t.Fatalf("found only %v / histograms %v in internal/", m.names, m.histograms)
	}
	return m
}

func runtimeMetrics(t *testing.T) metricSet {
	m := metricSet{map[string]bool{"up": true}, map[string]bool{}}
	name := regexp.MustCompile(`\.(?:inc|add|counter|counterFunction|gauge|gaugeFunction|histogram|describe)\("(cpuslot_\w+)"`)
	hist := regexp.MustCompile(`\.histogram\("(cpuslot_\w+)"`)
	scan(t, filepath.Join(repoRoot, "runtime-image/runtime/src/main"), ".java", func(_, src string) {
		for _, s := range name.FindAllStringSubmatch(src, -1) {
			m.names[s[1]] = true
		}
		for _, s := range hist.FindAllStringSubmatch(src, -1) {
			m.histograms[s[1]] = true
		}
	})
	if len(m.names) < 10 || len(m.histograms) < 1 {
		t.Fatalf("found only %v / histograms %v in runtime-image", m.names, m.histograms)
	}
	return m
}

// TestQueries checks every shipped query: only metrics the code exports,
// the right job selector, balanced brackets. TestGenerate checks queries.txt.
func TestQueries(t *testing.T) {
	qs, errs := collectQueries(render(t, queryValues...))
	for _, err := range errs {
		t.Error(err)
	}
	agentM, runtimeM := agentMetrics(t), runtimeMetrics(t)
	seen := map[string]bool{}
	for _, q := range qs {
		if seen[q.source] {
			t.Errorf("duplicate source %s", q.source)
		}
		seen[q.source] = true
		if strings.Contains(q.expr, "$") || q.expr == "" {
			t.Errorf("%s: %q", q.source, q.expr)
		}
		if !balanced(q.expr) {
			t.Errorf("%s: unbalanced brackets or quotes: %s", q.source, q.expr)
		}
		ms := metricsOf(q.expr)
		if len(ms) == 0 {
			t.Errorf("%s: no metric found in %s", q.source, q.expr)
		}
		set, job := agentM, `job="cpuslot-node-agent"`
		if strings.HasPrefix(q.source, "cpuslot-runtime:") {
			set, job = runtimeM, `job="cpuslot-runtime"`
		}
		for _, m := range ms {
			if !set.has(m) {
				t.Errorf("%s: metric %s is not exported by the %s", q.source, m, map[bool]string{true: "agent", false: "runtime"}[set.names["cpuslot_slots"]])
			}
		}
		// Every selector names the job: the agent's and the runtime's
		// cpuslot_invocations_total must not be confused with the agent's metrics.
		sels := regexp.MustCompile(`\b(?:cpuslot_[a-z0-9_]+|up|process_start_time_seconds)\{[^}]*\}`).FindAllString(q.expr, -1)
		if len(sels) != len(ms) {
			t.Errorf("%s: a metric without a label selector in %s", q.source, q.expr)
		}
		for _, s := range sels {
			if !strings.Contains(s, job) {
				t.Errorf("%s: selector %s lacks %s", q.source, s, job)
			}
		}
	}
	for _, want := range []string{"cpuslot-node:var:node", "cpuslot-runtime:var:function", "alert:CpuslotAcquireLatencyHigh:signal"} {
		if !seen[want] {
			t.Errorf("no query %s", want)
		}
	}
	// The node dashboard covers what the issue asks for.
	var nodeExprs strings.Builder
	for _, q := range qs {
		if strings.HasPrefix(q.source, "cpuslot-node:") {
			nodeExprs.WriteString(q.expr + "\n")
		}
	}
	for _, m := range []string{"cpuslot_containers", "cpuslot_slots", "cpuslot_acquisitions_total",
		"histogram_quantile(0.99, sum by (le) (rate(cpuslot_acquire_duration_seconds_bucket",
		"cpuslot_invocation_cpu_seconds_total", "cpuslot_invocation_throttled_seconds_total",
		"cpuslot_admission_total", "cpuslot_errors_total"} {
		if !strings.Contains(nodeExprs.String(), m) {
			t.Errorf("node dashboard has no query with %s", m)
		}
	}
}

// balanced checks (), {}, [] and double quotes.
func balanced(s string) bool {
	var stack []rune
	pair := map[rune]rune{')': '(', '}': '{', ']': '['}
	inStr := false
	for i, r := range s {
		if inStr {
			if r == '"' && (i == 0 || s[i-1] != '\\') {
				inStr = false
			}
			continue
		}
		switch r {
		case '"':
			inStr = true
		case '(', '{', '[':
			stack = append(stack, r)
		case ')', '}', ']':
			if len(stack) == 0 || stack[len(stack)-1] != pair[r] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return !inStr && len(stack) == 0
}

// TestPromtool parses every query of queries.txt with promtool (as
// recording rules), when promtool is installed.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed")
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, QueriesFile))
	if err != nil {
		t.Fatal(err)
	}
	var rules []any
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 {
			t.Fatalf("queries.txt: bad line %q", line)
		}
		rules = append(rules, map[string]any{"record": fmt.Sprintf("cpuslot:query:%d", len(rules)), "expr": f[2]})
	}
	out, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "queries", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "queries.rules.yml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules (every query of queries.txt): %v\n%s", err, out)
	} else {
		t.Logf("promtool parsed %d queries", len(rules))
	}
}

// dashboardExprs are the panel queries of each rendered dashboard, sorted,
// by dashboard file (node, runtime): from the Grafana ConfigMaps and from
// the PersesDashboards.
func dashboardExprs(t *testing.T, objs []obj) (grafana, perses map[string][]string) {
	t.Helper()
	grafana, perses = map[string][]string{}, map[string][]string{}
	for _, cm := range find(objs, "ConfigMap") {
		for k, v := range get(cm, "data").(map[string]any) {
			name, ok := strings.CutSuffix(strings.TrimPrefix(k, "cpuslot-"), ".json")
			if !ok {
				continue
			}
			var d map[string]any
			if err := yaml.Unmarshal([]byte(v.(string)), &d); err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			for _, p := range list(d, "panels") {
				for _, tg := range list(p, "targets") {
					grafana[name] = append(grafana[name], str(tg, "expr"))
				}
			}
			slices.Sort(grafana[name])
		}
	}
	for _, pd := range find(objs, "PersesDashboard") {
		name := strings.TrimPrefix(pd.name(), "cpuslot-")
		panels, _ := get(pd, "spec", "panels").(map[string]any)
		for _, p := range panels {
			for _, q := range list(p, "spec", "queries") {
				perses[name] = append(perses[name], str(q, "spec", "plugin", "spec", "query"))
			}
		}
		slices.Sort(perses[name])
	}
	return grafana, perses
}

// textVars are a PersesDashboard's constant variables by name.
func textVars(pd obj) map[string]string {
	out := map[string]string{}
	for _, v := range list(pd, "spec", "variables") {
		if str(v, "kind") == "TextVariable" {
			out[str(v, "spec", "name")] = str(v, "spec", "value")
		}
	}
	return out
}

// TestPersesDashboards: off by default; on, one PersesDashboard per
// Grafana dashboard with the same queries, the job variables from the
// values, in the namespace asked for.
func TestPersesDashboards(t *testing.T) {
	if n := len(find(render(t), "PersesDashboard")); n != 0 {
		t.Errorf("%d PersesDashboards by default, want none", n)
	}
	objs := render(t, "--set", "perses.dashboards.enabled=true")
	pds := find(objs, "PersesDashboard")
	if len(pds) != 2 {
		t.Fatalf("%d PersesDashboards, want 2 (node, runtime)", len(pds))
	}
	for _, pd := range pds {
		if str(pd, "apiVersion") != "perses.dev/v1alpha1" || str(pd, "metadata", "namespace") != manifestNamespace ||
			str(pd, "spec", "display", "name") == "" || len(list(pd, "spec", "layouts")) == 0 {
			t.Errorf("PersesDashboard %s: apiVersion %q, namespace %q, display %q, %d layouts", pd.name(), str(pd, "apiVersion"),
				str(pd, "metadata", "namespace"), str(pd, "spec", "display", "name"), len(list(pd, "spec", "layouts")))
		}
	}
	grafana, perses := dashboardExprs(t, objs)
	if len(grafana) != 2 || !reflect.DeepEqual(grafana, perses) {
		t.Errorf("the Perses dashboards' queries differ from the Grafana dashboards':\ngrafana %q\nperses  %q", grafana, perses)
	}
	if v := textVars(pds[0]); v["agent_job"] != "cpuslot-node-agent" {
		t.Errorf("node dashboard variables %v", v)
	}

	objs = render(t, "--set", "perses.dashboards.enabled=true,perses.dashboards.runtime=false,perses.dashboards.namespace=perses,"+
		"perses.dashboards.labels.team=infra,metrics.job=agents,runtimeMetrics.job=fns")
	pds = find(objs, "PersesDashboard")
	if len(pds) != 1 || pds[0].name() != "cpuslot-node" {
		t.Fatalf("runtime=false: %d PersesDashboards, want cpuslot-node alone", len(pds))
	}
	if str(pds[0], "metadata", "namespace") != "perses" || str(pds[0], "metadata", "labels", "team") != "infra" {
		t.Errorf("namespace %q, labels %v", str(pds[0], "metadata", "namespace"), get(pds[0], "metadata", "labels"))
	}
	if v := textVars(pds[0]); v["agent_job"] != "agents" {
		t.Errorf("metrics.job=agents: variables %v", v)
	}
	objs = render(t, "--set", "perses.dashboards.enabled=true,runtimeMetrics.job=fns")
	for _, pd := range find(objs, "PersesDashboard") {
		if pd.name() == "cpuslot-runtime" && textVars(pd)["runtime_job"] != "fns" {
			t.Errorf("runtimeMetrics.job=fns: variables %v", textVars(pd))
		}
	}
}
