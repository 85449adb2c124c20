package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// Local chaining on the cluster (docs/chaining.md): one OpenWhisk action pod
// whose runtime also hosts functions registered with Hydra's /register
// beside its action (the co-location docs/chaining.md describes), and a
// Knative Service for the callee that is not local.

const chainNS = "e2e-chain"

// hopLine is one hop's record in its caller's activation log
// ("cpuslot: activation=... action=... status=... chain=... path=... slot=N ...").
type hopLine map[string]string

// hopLines parses the hop records in a pod's log.
func hopLines(log string) []hopLine {
	var out []hopLine
	for _, l := range strings.Split(log, "\n") {
		_, rest, ok := strings.Cut(l, "cpuslot: activation=")
		if !ok || !strings.Contains(rest, " chain=") {
			continue
		}
		h := hopLine{}
		for _, f := range strings.Fields("activation=" + rest) {
			if k, v, ok := strings.Cut(f, "="); ok {
				if _, seen := h[k]; !seen { // error=... may hold more k=v words
					h[k] = v
				}
			}
		}
		out = append(out, h)
	}
	return out
}

// slotQuotaMilli is the CPU quota of a slot's cgroup (cgroup v1 or v2), in millicores.
func slotQuotaMilli(dir string) (int, error) {
	q, _, err := slotQuota(dir)
	return q, err
}

// slotQuota is the CPU quota of a slot's cgroup in millicores, and its CFS period.
func slotQuota(dir string) (int, time.Duration, error) {
	var quota, period string
	if b, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us")); err == nil {
		p, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us"))
		if err != nil {
			return 0, 0, err
		}
		quota, period = strings.TrimSpace(string(b)), strings.TrimSpace(string(p))
	} else if b, err2 := os.ReadFile(filepath.Join(dir, "cpu.max")); err2 == nil {
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return 0, 0, fmt.Errorf("%s/cpu.max: %q", dir, b)
		}
		quota, period = f[0], f[1]
	} else {
		return 0, 0, err
	}
	q, err := strconv.Atoi(quota)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: quota %q", dir, quota)
	}
	p, err := strconv.Atoi(period)
	if err != nil || p <= 0 {
		return 0, 0, fmt.Errorf("%s: period %q", dir, period)
	}
	return q * 1000 / p, time.Duration(p) * time.Microsecond, nil
}

// register registers a Java function of the samples jar with Hydra's
// /register (the jar in the body) under the owner guest, the action pod's
// OpenWhisk namespace: a chain reaches only its owner's functions.
func register(ctx context.Context, t *testing.T, base, name, class, quota string, jar []byte) {
	t.Helper()
	q := url.Values{"name": {name}, "language": {"java"}, "entryPoint": {class}, "quota": {quota}, "owner": {"guest"}}
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/register?"+q.Encode(), bytes.NewReader(jar))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("/register %s: %v", name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/register %s: %d %s", name, resp.StatusCode, b)
	}
}

// quotaAsValue sets the recipe's CPUSLOT_DEFAULT_QUOTA as a value instead of
// the annotation's fieldRef, which Knative admits only with a feature flag
// this test leaves off (TestKnativeServing checks the webhook refuses it).
func quotaAsValue(ctr map[string]any, q string) {
	for i, e := range ctr["env"].([]any) {
		if e.(map[string]any)["name"] == "CPUSLOT_DEFAULT_QUOTA" {
			ctr["env"].([]any)[i] = map[string]any{"name": "CPUSLOT_DEFAULT_QUOTA", "value": q}
		}
	}
}

// chainOnKnative (a subtest of TestKnativeServing, whose Knative Serving
// and agent it uses): a chain declared the platform's way (an OpenWhisk
// action's CPUSLOT_CHAIN_STEPS) runs in an action pod's runtime, each hop in
// a slot of its own at its own quota; then the hop latency of a call to a
// no-op function, local against through Knative (the revision's Service:
// kube-proxy, activator, queue-proxy), measured inside the runtime.
func chainOnKnative(t *testing.T, c *cluster.Cluster, kn *knativeServing, agentNS string) {
	jar := samplesJar(t)
	code := base64.StdEncoding.EncodeToString(jar)
	namespace(t, c, chainNS)
	api := startFakeOpenWhiskAPI(t, c)
	api.quota["pipe"] = "100m"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c.Kubectl(ctx, "-n", knNS, "delete", "ksvc", "hop", "--wait=false")
	})

	// The callee that is not local: a Knative Service of the no-op
	// HelloWorld, one pod kept up (its code arrives with its first request,
	// which the chain's calls do not carry).
	hopRev := applyKnService(ctx, t, c, "hop", knService(t, "hop", func(ann, ctr, _ map[string]any) {
		quotaAsValue(ctr, "250m")
		ann["autoscaling.knative.dev/min-scale"] = "1"
		ann["autoscaling.knative.dev/max-scale"] = "1"
	}))
	hello := knFn{init: map[string]any{"name": "hello", "main": "dev.cpuslot.samples.HelloWorld", "binary": true, "code": code}}
	hello.mustInvoke(ctx, t, kn.activator, hopRev, "hop-init", 0, nil)
	// No DNS server here: the caller pod gets the revision Service's name
	// in /etc/hosts. The activator takes the revision from that Host.
	hopIP, err := c.Kubectl(ctx, "-n", knNS, "get", "service", hopRev, "-o", "jsonpath={.spec.clusterIP}")
	if err != nil || hopIP == "" {
		t.Fatalf("ClusterIP of Service %s: %v %q", hopRev, err, hopIP)
	}
	hopHost := hopRev + "." + knNS + ".svc.cluster.local"

	base, _ := startActionPod(ctx, t, c, agentNS, chainNS, api, func(pod map[string]any) {
		spec := pod["spec"].(map[string]any)
		spec["hostAliases"] = []any{map[string]any{"ip": hopIP, "hostnames": []any{hopHost}}}
		ctr := spec["containers"].([]any)[0].(map[string]any)
		setEnv(ctr, "CPUSLOT_CHAIN_URLS", "hop=http://"+hopHost)
		// Scheduled beside the Knative subtests' pods, which may still be
		// draining, on 2 cores: a small request. The limit is the pod's
		// slot budget: the slots the runtime holds (100m, 250m, 500m for
		// the sequence, 500m and 200m for the latency) fit it at once.
		res := ctr["resources"].(map[string]any)
		res["requests"].(map[string]any)["cpu"] = "250m"
		res["limits"].(map[string]any)["cpu"] = "2"
	})
	p := getPod(ctx, t, c, chainNS, actionPodName, "user-action")
	cg := cluster.ContainerCgroupDir("cpu", p.QOS, p.UID, p.ContainerID)
	podLog := func() string {
		out, err := c.Kubectl(ctx, "-n", chainNS, "logs", actionPodName, "-c", "user-action")
		if err != nil {
			t.Fatalf("kubectl logs %s: %v", actionPodName, err)
		}
		return out
	}

	// The action pipe (CpuBurn, 100m from its cpu-quota annotation) names
	// its steps in its /init env, as OpenWhisk users name a sequence's:
	// burn250 and burn500 (CpuBurn at 250m and 500m, 1 s of CPU-bound work
	// each), registered beside it.
	t.Run("declared sequence runs locally, each hop in its own slot", func(t *testing.T) {
		r, err := post(ctx, base+"/init", map[string]any{"value": map[string]any{
			"name": "pipe", "main": "dev.cpuslot.samples.CpuBurn", "binary": true, "code": code,
			"env": invokerInitEnv(api.apiKey, "pipe", map[string]string{"CPUSLOT_CHAIN_STEPS": "burn250,burn500"}),
		}})
		if err != nil || r.status != 200 {
			t.Fatalf("/init: %v %d %s", err, r.status, r.body)
		}
		register(ctx, t, base, "burn250", "dev.cpuslot.samples.CpuBurn", "250m", jar)
		register(ctx, t, base, "burn500", "dev.cpuslot.samples.CpuBurn", "500m", jar)
		runPipe := func(id string) (invokeResult, error) {
			return post(ctx, base+"/run", map[string]any{
				"value":     map[string]any{"ms": 200, "threads": 1},
				"namespace": "guest", "action_name": "/guest/pipe", "action_version": "0.0.1",
				"activation_id": id, "transaction_id": "tid-" + id, "api_key": api.apiKey,
				"deadline": strconv.FormatInt(time.Now().Add(60*time.Second).UnixMilli(), 10),
			})
		}
		// The action's own quota comes from its annotation, read in the
		// background: until then it runs without one (no slot).
		n := waitAnnotationQuota(t, func(i int) (invokeResult, error) { return runPipe(fmt.Sprintf("w%031d", i)) })
		t.Logf("the action's annotation quota applies from /run %d", n)
		chainHdr := regexp.MustCompile(`^burn250=\d+,burn500=\d+$`)
		want := map[string]int{"pipe": 100, "burn250": 250, "burn500": 500}
		// The lower bound of a share only counts when the machine let the
		// hop run: up to three activations.
		for try := 1; ; try++ {
			id := fmt.Sprintf("c%031d", try)
			r, err := runPipe(id)
			if err != nil || r.status != 200 {
				t.Fatalf("/run: %v %d %s", err, r.status, r.body)
			}
			var res map[string]any
			if err := json.Unmarshal(r.body, &res); err != nil || res["iterations"] == nil {
				t.Fatalf("the sequence's answer is not the last step's (CpuBurn's) result: %v %s", err, r.body)
			}
			if h := r.headers.Get("X-Cpuslot-Chain-Hops"); h != "2" {
				t.Errorf("X-Cpuslot-Chain-Hops %q, want 2", h)
			}
			if h := r.headers.Get("X-Cpuslot-Chain"); !chainHdr.MatchString(h) {
				t.Errorf("X-Cpuslot-Chain %q, want burn250=<cpu_ns>,burn500=<cpu_ns> (both measured in a slot)", h)
			}
			callerSlot := r.headers.Get("X-Cpuslot-Slot")
			if callerSlot == "" {
				t.Fatalf("the action ran without a slot: %s (quota %s from %s)", r.headers.Get("X-Cpuslot-Noslot"),
					r.headers.Get("X-Cpuslot-Quota-Milli"), r.headers.Get("X-Cpuslot-Quota-Source"))
			}
			if got, err := slotQuotaMilli(filepath.Join(cg, "cpuslot-"+callerSlot)); err != nil || got != want["pipe"] {
				t.Errorf("the action ran in slot %s of quota %dm (%v), want %dm", callerSlot, got, err, want["pipe"])
			}
			// Its caller's log gets a record per hop when the caller's output is written.
			hops := map[string]hopLine{}
			if err := pollFor(ctx, 30*time.Second, func() (bool, string) {
				for _, h := range hopLines(podLog()) {
					if h["caller"] == id {
						hops[h["action"]] = h
					}
				}
				return len(hops) == 2, fmt.Sprintf("hop records of activation %s in the pod's log: %v", id, hops)
			}); err != nil {
				t.Fatal(err)
			}
			slots := map[string]string{callerSlot: "pipe"}
			inBounds := true
			for _, name := range []string{"burn250", "burn500"} {
				h, milli := hops[name], want[name]
				if h["status"] != "ok" || h["chain"] != "sequence" || h["path"] != "local" || h["quota"] != strconv.Itoa(milli)+"m" {
					t.Errorf("%s: %v, want status=ok chain=sequence path=local quota=%dm", name, h, milli)
				}
				slot := h["slot"]
				if slot == "" || slot == "none" {
					t.Fatalf("hop %s ran without a slot: %v", name, h)
				}
				if other, dup := slots[slot]; dup {
					t.Errorf("hop %s ran in slot %s, as did %s", name, slot, other)
				}
				slots[slot] = name
				got, period, err := slotQuota(filepath.Join(cg, "cpuslot-"+slot))
				if err != nil {
					t.Fatal(err)
				}
				if got != milli {
					t.Errorf("hop %s ran in slot %s of quota %dm, want %dm", name, slot, got, milli)
				}
				cpu, err1 := strconv.ParseFloat(h["cpu_ns"], 64)
				ms, err2 := strconv.ParseFloat(h["duration_ms"], 64)
				if err1 != nil || err2 != nil || ms <= 0 {
					t.Fatalf("hop %s: cpu_ns %q duration_ms %q", name, h["cpu_ns"], h["duration_ms"])
				}
				share, w := cpu/(ms*1e6), float64(milli)/1000
				// A run of 1 s spans one CFS period more than its length:
				// it may get that period's quota on top.
				slack := w * float64(period) / (ms * 1e6)
				t.Logf("hop %s: slot %s (cgroup quota %dm), outcome %s, %.1f%% of a CPU over its %.0f ms", name, slot, got, h["outcome"], 100*share, ms)
				if share > w+0.025+slack {
					t.Fatalf("hop %s: %.1f%% of a CPU at %dm over %.0f ms: above the cap (+ %.1f points for the period %v)", name, 100*share, milli, ms, 100*slack, period)
				}
				// 500m is half a core, which this busy 2-core machine may not
				// have to give (as in TestKnativeServing): its cap is checked,
				// its share logged.
				if milli <= 250 && share < w-0.025 {
					inBounds = false
				}
			}
			t.Logf("activation %s: X-Cpuslot-Chain %s, chain CPU %s ns, the action in slot %s", id,
				r.headers.Get("X-Cpuslot-Chain"), r.headers.Get("X-Cpuslot-Chain-Cpu-Ns"), callerSlot)
			if inBounds {
				break
			}
			if try == 3 {
				t.Fatalf("burn250 below its quota's share after 3 tries (machine busy?)")
			}
		}
	})

	// bench (the samples' ChainBench) calls noop (HelloWorld) in process and
	// hop through Knative, rounds alternating, each call timed inside bench.
	t.Run("hop latency local and through Knative", func(t *testing.T) {
		register(ctx, t, base, "noop", "dev.cpuslot.samples.HelloWorld", "200m", jar)
		register(ctx, t, base, "bench", "dev.cpuslot.samples.ChainBench", "500m", jar)
		// The activator is in the path: target-burst-capacity -1 (this
		// cluster's Knative config) keeps the revision's Service in proxy
		// mode, its endpoints the activator's.
		mode, _ := c.Kubectl(ctx, "-n", knNS, "get", "serverlessservice", hopRev, "-o", "jsonpath={.spec.mode}")
		eps, _ := c.Kubectl(ctx, "-n", knNS, "get", "endpointslices", "-l", "kubernetes.io/service-name="+hopRev,
			"-o", "jsonpath={.items[*].endpoints[*].addresses[*]}")
		act, _ := c.Kubectl(ctx, "-n", "knative-serving", "get", "pods", "-l", "app=activator", "-o", "jsonpath={.items[*].status.podIP}")
		if mode != "Proxy" || act == "" || strings.TrimSpace(eps) != strings.TrimSpace(act) {
			t.Errorf("Service %s: mode %q, endpoints %q, want Proxy to the activator %q", hopRev, mode, eps, act)
		}
		hopPod, err := revPods(ctx, c, hopRev)
		if err != nil || len(hopPod) != 1 {
			t.Fatalf("pods of %s: %v %v", hopRev, hopPod, err)
		}
		hopMetrics := "http://" + podIP(ctx, t, c, knNS, hopPod[0]) + ":9102/metrics"
		servedBefore, err := counterSum(ctx, hopMetrics, "cpuslot_invocations_total", `platform="knative"`, `status="ok"`)
		if err != nil {
			t.Fatal(err)
		}
		run := func(callee string, n int) []time.Duration {
			args, _ := json.Marshal(map[string]any{"mode": "local", "callee": callee, "n": n})
			r, err := post(ctx, base+"/", map[string]any{"name": "bench", "arguments": string(args)})
			if err != nil || r.status != 200 {
				t.Fatalf("bench calling %s: %v %d %s", callee, err, r.status, r.body)
			}
			if h := r.headers.Get("X-Cpuslot-Chain-Hops"); h != strconv.Itoa(n) {
				t.Fatalf("bench calling %s %d times: X-Cpuslot-Chain-Hops %q", callee, n, h)
			}
			// local: the hop's CPU measured in its slot; through the platform: "-"
			first, _, _ := strings.Cut(r.headers.Get("X-Cpuslot-Chain"), ",")
			if local := !strings.HasSuffix(first, "=-"); !strings.HasPrefix(first, callee+"=") || local != (callee == "noop") {
				t.Fatalf("bench calling %s: X-Cpuslot-Chain starts %q", callee, first)
			}
			var out struct {
				Result struct {
					NS []int64 `json:"ns"`
				} `json:"result"`
			}
			if err := json.Unmarshal(r.body, &out); err != nil || len(out.Result.NS) != n {
				t.Fatalf("bench calling %s: %v %s", callee, err, r.body)
			}
			d := make([]time.Duration, n)
			for i, ns := range out.Result.NS {
				d[i] = time.Duration(ns)
			}
			return d
		}
		run("noop", 10) // warm-up, both paths
		run("hop", 10)
		const rounds, calls = 6, 40
		lat := map[string][]time.Duration{}
		for round := 0; round < rounds; round++ {
			order := []string{"noop", "hop"}
			if round%2 == 1 {
				order = []string{"hop", "noop"}
			}
			for _, callee := range order {
				lat[callee] = append(lat[callee], run(callee, calls)...)
			}
		}
		// Where the hops ran: noop's in slots of this pod, hop's in the revision pod.
		outcomes, slotsSeen, knHops := map[string]int{}, map[string]bool{}, 0
		for _, h := range hopLines(podLog()) {
			switch {
			case h["action"] == "noop" && h["path"] == "local":
				if h["slot"] == "" || h["slot"] == "none" {
					t.Errorf("a local hop to noop ran without a slot: %v", h)
					continue
				}
				outcomes[h["outcome"]]++
				slotsSeen[h["slot"]] = true
			case h["action"] == "hop" && h["path"] == "knative" && h["status"] == "ok":
				knHops++
			}
		}
		total := 10 + rounds*calls
		if len(slotsSeen) == 0 {
			t.Errorf("no record of a local hop to noop in the pod's log")
		}
		for s := range slotsSeen {
			if got, err := slotQuotaMilli(filepath.Join(cg, "cpuslot-"+s)); err != nil || got != 200 {
				t.Errorf("noop ran in slot %s of quota %dm (%v), want 200m", s, got, err)
			}
		}
		if knHops != total {
			t.Errorf("%d records of hops to hop through Knative, want %d", knHops, total)
		}
		servedAfter, err := counterSum(ctx, hopMetrics, "cpuslot_invocations_total", `platform="knative"`, `status="ok"`)
		if err != nil {
			t.Fatal(err)
		}
		if served := int(servedAfter - servedBefore); served < total {
			t.Errorf("the revision pod %s answered %d invocations, want the %d hops", hopPod[0], served, total)
		}
		t.Logf("local hops' slot outcomes %v (slots %v); %d hops through Knative, answered by %s", outcomes, sortedKeys(slotsSeen), knHops, hopPod[0])
		lp50, lp99 := cluster.Percentile(lat["noop"], 0.5), cluster.Percentile(lat["noop"], 0.99)
		kp50, kp99 := cluster.Percentile(lat["hop"], 0.5), cluster.Percentile(lat["hop"], 0.99)
		t.Logf("Measured hop latency (call to return, inside the caller), %d calls each, %d alternating rounds:", rounds*calls, rounds)
		t.Logf("  local (Chain.call, noop in its own 200m slot, bench in a 500m one): p50 %v p99 %v", lp50.Round(100*time.Nanosecond), lp99.Round(100*time.Nanosecond))
		t.Logf("  Knative (Service %s: kube-proxy, activator, queue-proxy): p50 %v p99 %v", hopRev, kp50.Round(100*time.Nanosecond), kp99.Round(100*time.Nanosecond))
		t.Logf("  ratio Knative / local: p50 %.1fx p99 %.1fx", float64(kp50)/float64(lp50), float64(kp99)/float64(lp99))
	})
}

// counterSum adds the samples of a Prometheus counter whose labels contain
// every one of match.
func counterSum(ctx context.Context, url, name string, match ...string) (float64, error) {
	body, err := metricsPage(ctx, url)
	if err != nil {
		return 0, err
	}
	sum := 0.0
next:
	for _, l := range strings.Split(body, "\n") {
		labels, ok := strings.CutPrefix(l, name+"{")
		if !ok {
			continue
		}
		for _, m := range match {
			if !strings.Contains(labels, m) {
				continue next
			}
		}
		_, value, _ := strings.Cut(labels, "} ")
		f := strings.Fields(value) // the value, then maybe a timestamp
		if len(f) == 0 {
			return 0, fmt.Errorf("%s: %q", url, l)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q", url, l)
		}
		sum += v
	}
	return sum, nil
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
