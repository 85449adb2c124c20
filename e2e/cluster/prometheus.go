package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// What the v1 and v2 node tests share to check the shipped monitoring on a
// real Prometheus: the shipped file_sd configuration, the targets a
// harness writes from the API, the chart's queries and a client of the
// query API. Where Prometheus runs is each test's own.

// PrometheusConfig returns deploy/prometheus/prometheus-file-sd.yml with
// its scrape and evaluation intervals set to interval (a test need not
// wait 15 s per sample), and the chart's rule file
// (deploy/prometheus/cpuslot-rules.yml), which the configuration names.
func PrometheusConfig(repo string, interval time.Duration) (config, rules []byte, err error) {
	src, err := os.ReadFile(filepath.Join(repo, "deploy", "prometheus", "prometheus-file-sd.yml"))
	if err != nil {
		return nil, nil, err
	}
	rules, err = os.ReadFile(filepath.Join(repo, "deploy", "prometheus", "cpuslot-rules.yml"))
	if err != nil {
		return nil, nil, err
	}
	lines := strings.Split(string(src), "\n")
	set := 0
	for i, line := range lines {
		trim := strings.TrimSpace(line)
		key, _, _ := strings.Cut(trim, ":")
		if key == "scrape_interval" || key == "evaluation_interval" {
			lines[i] = line[:len(line)-len(trim)] + key + ": " + interval.String()
			set++
		}
	}
	if set != 2 {
		return nil, nil, fmt.Errorf("prometheus-file-sd.yml: %d of scrape_interval and evaluation_interval found, want both", set)
	}
	return []byte(strings.Join(lines, "\n")), rules, nil
}

// FileSDGroup is one target group of Prometheus's file_sd format.
type FileSDGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// TargetFiles returns the file_sd files of prometheus-file-sd.yml,
// "node-agent.json" and "runtime.json", for the pods of `kubectl get pods
// -A -o json`: the chart's agent pods (<pod IP>:9464) and the running
// runtime pods (OpenWhisk action pods, Knative revision pods, pods
// annotated cpuslot.dev/enabled=true; <pod IP>:9102 or the
// prometheus.io/port annotation), with the labels the Kubernetes variant
// (deploy/prometheus/prometheus.yml) adds.
func TargetFiles(podsJSON []byte) (map[string][]byte, error) {
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
	if err := json.Unmarshal(podsJSON, &pods); err != nil {
		return nil, fmt.Errorf("pods: %w", err)
	}
	agents, runtimes := []FileSDGroup{}, []FileSDGroup{}
	for _, pod := range pods.Items {
		m := pod.Metadata
		if pod.Status.PodIP == "" || pod.Status.Phase != "Running" {
			continue
		}
		labels := map[string]string{"namespace": m.Namespace, "pod": m.Name, "node": pod.Spec.NodeName}
		switch {
		case m.Labels["app.kubernetes.io/name"] == "cpuslot" && m.Labels["app.kubernetes.io/component"] == "node-agent":
			agents = append(agents, FileSDGroup{[]string{pod.Status.PodIP + ":9464"}, labels})
		case m.Annotations["cpuslot.dev/enabled"] == "false":
		case m.Labels["user-action-pod"] == "true" || m.Labels["serving.knative.dev/revision"] != "" || m.Annotations["cpuslot.dev/enabled"] == "true":
			port := "9102"
			if v := m.Annotations["prometheus.io/port"]; v != "" {
				port = v
			}
			runtimes = append(runtimes, FileSDGroup{[]string{pod.Status.PodIP + ":" + port}, labels})
		}
	}
	files := map[string][]byte{}
	for name, groups := range map[string][]FileSDGroup{"node-agent.json": agents, "runtime.json": runtimes} {
		b, err := json.Marshal(groups)
		if err != nil {
			return nil, err
		}
		files[name] = b
	}
	return files, nil
}

// PodTargetFiles is TargetFiles of the pods running now; kubectl is a
// cluster's (Cluster.Kubectl, or the v2 node's).
func PodTargetFiles(ctx context.Context, kubectl func(context.Context, ...string) (string, error)) (map[string][]byte, error) {
	out, err := kubectl(ctx, "get", "pods", "-A", "-o", "json")
	if err != nil {
		return nil, err
	}
	return TargetFiles([]byte(out))
}

// ShippedQuery is a line of charts/cpuslot/queries.txt.
type ShippedQuery struct {
	Source, Expect, Query string
}

// RuntimeSide says whether q reads the runtime pods' series (job
// cpuslot-runtime), which only a runtime pod (the Java runtime) exports.
func (q ShippedQuery) RuntimeSide() bool {
	return strings.Contains(q.Query, `job="cpuslot-runtime"`)
}

// ShippedQueries reads charts/cpuslot/queries.txt: every PromQL query of
// the chart's dashboards and alert rules.
func ShippedQueries(repo string) ([]ShippedQuery, error) {
	b, err := os.ReadFile(filepath.Join(repo, "charts", "cpuslot", "queries.txt"))
	if err != nil {
		return nil, err
	}
	var qs []ShippedQuery
	for i, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 || f[2] == "" {
			return nil, fmt.Errorf("queries.txt:%d: want SOURCE<tab>EXPECT<tab>QUERY: %q", i+1, line)
		}
		qs = append(qs, ShippedQuery{f[0], f[1], f[2]})
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("queries.txt: no query")
	}
	return qs, nil
}

// Prometheus is a client of a running Prometheus's HTTP API.
type Prometheus struct {
	// Base is its URL, e.g. http://127.0.0.1:9090.
	Base string
}

func (p *Prometheus) get(ctx context.Context, path string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", p.Base+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("GET %s: %s: %w", path, resp.Status, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, r.Error)
	}
	return json.Unmarshal(r.Data, out)
}

// WaitReady waits until /-/ready answers 200 or ctx ends.
func (p *Prometheus) WaitReady(ctx context.Context) error {
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", p.Base+"/-/ready", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			err = fmt.Errorf("/-/ready: %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("prometheus at %s not ready: %w (last: %v)", p.Base, ctx.Err(), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Query runs an instant query and returns the number of series (or
// samples) in its result.
func (p *Prometheus) Query(ctx context.Context, q string) (int, error) {
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query?query="+url.QueryEscape(q), &d); err != nil {
		return 0, fmt.Errorf("query %q: %w", q, err)
	}
	if d.ResultType == "scalar" || d.ResultType == "string" {
		return 1, nil
	}
	var series []json.RawMessage
	if err := json.Unmarshal(d.Result, &series); err != nil {
		return 0, fmt.Errorf("query %q: %w", q, err)
	}
	return len(series), nil
}

// Targets describes the active targets (job, instance, health, last
// error), for a failure message.
func (p *Prometheus) Targets(ctx context.Context) string {
	var d struct {
		ActiveTargets []struct {
			Labels    map[string]string `json:"labels"`
			Health    string            `json:"health"`
			LastError string            `json:"lastError"`
		} `json:"activeTargets"`
	}
	if err := p.get(ctx, "/api/v1/targets?state=active", &d); err != nil {
		return fmt.Sprintf("(targets: %v)", err)
	}
	var lines []string
	for _, t := range d.ActiveTargets {
		lines = append(lines, fmt.Sprintf("%s %s %s %s", t.Labels["job"], t.Labels["instance"], t.Health, t.LastError))
	}
	slices.Sort(lines)
	if len(lines) == 0 {
		return "(no active target)"
	}
	return strings.Join(lines, "\n")
}

// WaitSeries waits until q returns at least one series; the error names
// the query, its last error and the targets.
func (p *Prometheus) WaitSeries(ctx context.Context, q string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		n, err := p.Query(ctx, q)
		if err == nil && n > 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: no series after %v (%v)\n--- targets:\n%s", q, timeout, err, p.Targets(context.WithoutCancel(ctx)))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// RuleGroups returns the number of rules loaded and those whose last
// evaluation failed ("group/name: error").
func (p *Prometheus) RuleGroups(ctx context.Context) (rules int, bad []string, err error) {
	var d struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get(ctx, "/api/v1/rules", &d); err != nil {
		return 0, nil, err
	}
	for _, g := range d.Groups {
		for _, r := range g.Rules {
			rules++
			if r.Health == "err" || r.LastError != "" {
				bad = append(bad, fmt.Sprintf("%s/%s: %s %s", g.Name, r.Name, r.Health, r.LastError))
			}
		}
	}
	return rules, bad, nil
}

// EvalQueries evaluates every query of qs (each must evaluate: an error
// ends it) until each one want selects returns data or timeout passes, and
// returns the number of series each query returned in the last round.
func (p *Prometheus) EvalQueries(ctx context.Context, qs []ShippedQuery, want func(ShippedQuery) bool, timeout time.Duration) ([]int, error) {
	deadline := time.Now().Add(timeout)
	got := make([]int, len(qs))
	for {
		missing := 0
		for i, q := range qs {
			n, err := p.Query(ctx, q.Query)
			if err != nil {
				return got, fmt.Errorf("%s: %w", q.Source, err)
			}
			got[i] = n
			if n == 0 && want(q) {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			return got, nil
		}
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
