package cluster

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestPrometheusConfigSetsIntervals(t *testing.T) {
	repo, err := FindRepo(".")
	if err != nil {
		t.Fatal(err)
	}
	cfg, rules, err := PrometheusConfig(repo, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"  scrape_interval: 3s\n", "  evaluation_interval: 3s\n", "rule_files:\n  - cpuslot-rules.yml", "job_name: cpuslot-node-agent", "job_name: cpuslot-runtime"} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	if strings.Contains(string(cfg), "15s") {
		t.Errorf("an interval of the shipped file is left:\n%s", cfg)
	}
	if !strings.Contains(string(rules), "alert: CpuslotAgentDown") {
		t.Errorf("rules file lacks the chart's alerts:\n%s", rules)
	}
}

func TestTargetFiles(t *testing.T) {
	pods := `{"items": [
 {"metadata": {"name": "cpuslot-x7k2p", "namespace": "cpuslot-system",
   "labels": {"app.kubernetes.io/name": "cpuslot", "app.kubernetes.io/component": "node-agent"}},
  "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.0.2.15"}},
 {"metadata": {"name": "fn", "namespace": "default", "annotations": {"cpuslot.dev/enabled": "true"}},
  "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.244.0.7"}},
 {"metadata": {"name": "ow", "namespace": "ow", "labels": {"user-action-pod": "true"}, "annotations": {"prometheus.io/port": "9200"}},
  "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.244.0.8"}},
 {"metadata": {"name": "off", "namespace": "default", "labels": {"user-action-pod": "true"}, "annotations": {"cpuslot.dev/enabled": "false"}},
  "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.244.0.9"}},
 {"metadata": {"name": "pending", "namespace": "default", "annotations": {"cpuslot.dev/enabled": "true"}},
  "spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}},
 {"metadata": {"name": "other", "namespace": "default"},
  "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.244.0.10"}}
]}`
	files, err := TargetFiles([]byte(pods))
	if err != nil {
		t.Fatal(err)
	}
	decode := func(name string) []FileSDGroup {
		var g []FileSDGroup
		if err := json.Unmarshal(files[name], &g); err != nil {
			t.Fatalf("%s: %v: %s", name, err, files[name])
		}
		return g
	}
	agents, runtimes := decode("node-agent.json"), decode("runtime.json")
	if len(agents) != 1 || agents[0].Targets[0] != "10.0.2.15:9464" || agents[0].Labels["pod"] != "cpuslot-x7k2p" ||
		agents[0].Labels["namespace"] != "cpuslot-system" || agents[0].Labels["node"] != "n1" {
		t.Errorf("agents %+v", agents)
	}
	var got []string
	for _, g := range runtimes {
		got = append(got, g.Labels["pod"]+"="+strings.Join(g.Targets, ","))
	}
	if strings.Join(got, " ") != "fn=10.244.0.7:9102 ow=10.244.0.8:9200" {
		t.Errorf("runtime targets %v, want fn on 9102 and ow on its annotated port (not the opted-out, pending or unannotated pods)", got)
	}
	// No pod: empty lists, which Prometheus reads as no target.
	files, err = TargetFiles([]byte(`{"items": []}`))
	if err != nil || string(files["node-agent.json"]) != "[]" || string(files["runtime.json"]) != "[]" {
		t.Errorf("no pods: %q %v", files, err)
	}
	if _, err := TargetFiles([]byte(`{"items": {`)); err == nil {
		t.Error("bad JSON accepted")
	}
}

func TestShippedQueries(t *testing.T) {
	repo, err := FindRepo(".")
	if err != nil {
		t.Fatal(err)
	}
	qs, err := ShippedQueries(repo)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	runtime := 0
	for _, q := range qs {
		kinds[q.Expect]++
		if q.RuntimeSide() {
			runtime++
			if strings.Contains(q.Query, `job="cpuslot-node-agent"`) {
				t.Errorf("%s reads both jobs: %s", q.Source, q.Query)
			}
		}
	}
	if kinds["data"] == 0 || kinds["alert"] == 0 || kinds["error"] == 0 || kinds["budget"] == 0 || len(kinds) != 4 {
		t.Errorf("expectations %v, want data, error, budget and alert", kinds)
	}
	if runtime == 0 || runtime == len(qs) {
		t.Errorf("%d of %d queries read the runtime's series", runtime, len(qs))
	}
}

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	d := ms(9, 1, 5, 3, 7, 2, 8, 4, 6, 10)
	for _, c := range []struct {
		p    float64
		want int
	}{{0, 1}, {0.5, 5}, {0.99, 9}, {1, 10}} {
		if got := Percentile(d, c.p); got != time.Duration(c.want)*time.Millisecond {
			t.Errorf("p%v: %v, want %dms", c.p, got, c.want)
		}
	}
	if d[0] != 9*time.Millisecond {
		t.Error("Percentile sorted its argument")
	}
	if Percentile(nil, 0.5) != 0 {
		t.Error("no samples: want 0")
	}
}
