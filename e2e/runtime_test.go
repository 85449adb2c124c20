package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// The Java runtime image (make runtime-image) and the sample functions jar
// it is tested with.
const runtimeImage = "docker.io/cpuslot/runtime-jvm:dev"

func samplesJar(t *testing.T) []byte {
	t.Helper()
	repo, err := cluster.FindRepo(".")
	if err != nil {
		t.Fatal(err)
	}
	jar, err := cluster.SamplesJar(repo)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(jar)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func needRuntimeImage(t *testing.T) {
	t.Helper()
	repo, _ := cluster.FindRepo(".")
	if _, err := os.Stat(filepath.Join(repo, "bin", "images", "cpuslot-runtime.tar")); err != nil {
		t.Fatalf("the runtime image is not among the imported images (make images runs make runtime-image): %v", err)
	}
}

// fakeOpenWhiskAPI serves what the runtime reads from the OpenWhisk REST
// API: the action's annotations (GET /api/v1/namespaces/NS/actions/NAME),
// with basic auth by the activation's api_key. The one stand-in of these
// tests: the OpenWhisk controller cannot run here. It listens on the node's
// address, which pods reach through the CNI bridge.
type fakeOpenWhiskAPI struct {
	url    string
	apiKey string
	mu     sync.Mutex
	gets   int
	quota  map[string]string // action name -> cpu-quota annotation
}

func startFakeOpenWhiskAPI(t *testing.T, c *cluster.Cluster) *fakeOpenWhiskAPI {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(c.NodeIP(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeOpenWhiskAPI{
		url:    "http://" + ln.Addr().String(),
		apiKey: "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP",
		quota:  map[string]string{},
	}
	srv := &http.Server{Handler: f, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return f
}

func (f *fakeOpenWhiskAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	user, pass, ok := r.BasicAuth()
	if !ok || user+":"+pass != f.apiKey {
		http.Error(w, `{"error":"The supplied authentication is invalid"}`, http.StatusUnauthorized)
		return
	}
	// /api/v1/namespaces/{ns}/actions/{name}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method != "GET" || len(parts) < 6 || parts[0] != "api" || parts[2] != "namespaces" || parts[4] != "actions" {
		http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
		return
	}
	ns, name := parts[3], strings.Join(parts[5:], "/")
	f.mu.Lock()
	f.gets++
	q, ok := f.quota[name]
	f.mu.Unlock()
	if !ok {
		http.Error(w, `{"error":"The requested resource does not exist."}`, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"namespace": ns, "name": name, "version": "0.0.1", "publish": false,
		"annotations": []map[string]any{
			{"key": "exec", "value": "java:cpuslot"},
			{"key": "cpu-quota", "value": q},
		},
		"limits": map[string]any{"timeout": 60000, "memory": 512, "logs": 10, "concurrency": 4},
		"exec":   map[string]any{"kind": "java:cpuslot", "binary": true},
	})
}

// The action pod as OpenWhisk's invoker creates it with the recipe in
// deploy/openwhisk (see deploy/openwhisk/action-pod.example.yaml), the CPU
// request/limit lowered to fit this 2-core node beside the agent, and a
// longer acquire budget: these tests prove each concurrent invocation gets a
// slot, and with an emulated node beside this one on two cores the agent's
// answer to a miss has taken longer than the default 50 ms (the runtime then
// runs the invocation without a slot, by design; the budget's own tests are
// the slot client's).
const openWhiskActionPod = `
apiVersion: v1
kind: Pod
metadata:
  name: wskowdev-invoker-00-1-guest-cpuburn
  namespace: %[1]s
  labels:
    invoker: invoker0
    name: wskowdev-invoker-00-1-guest-cpuburn
    release: owdev
    user-action-pod: "true"
  annotations:
    prometheus.io/port: "9102"
    prometheus.io/scrape: "true"
spec:
  restartPolicy: Always
  containers:
  - name: user-action
    image: %[2]s
    imagePullPolicy: Never
    env:
    - name: __OW_API_HOST
      value: %[3]s
    - name: __OW_ALLOW_CONCURRENT
      value: "true"
    - name: CPUSLOT_SOCKET
      value: /run/cpuslot/agent.sock
    - name: CPUSLOT_ACQUIRE_BUDGET_MS
      value: "5000"
    ports:
    - containerPort: 8080
      name: action
    resources:
      limits: {cpu: "1", memory: 512Mi}
      requests: {cpu: "1", memory: 512Mi}
    securityContext:
      capabilities:
        drop: [NET_RAW, NET_ADMIN]
    volumeMounts:
    - mountPath: /run/cpuslot
      name: cpuslot
  volumes:
  - name: cpuslot
    emptyDir: {}
`

type invokeResult struct {
	status  int
	body    []byte
	headers http.Header
	elapsed time.Duration
}

func post(ctx context.Context, url string, body any) (invokeResult, error) {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	// the invocation's CPU in the answer (X-Cpuslot-Cpu-Ns): the runtime reads it after the reply otherwise
	req.Header.Set("X-Cpuslot-Usage", "reply")
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return invokeResult{}, err
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	return invokeResult{resp.StatusCode, rb, resp.Header, time.Since(t0)}, nil
}

// waitHTTP waits until the pod's runtime answers at all (its JVM started);
// why not, when it does not: what diagnose returns (the pod's state and
// logs), if given.
func waitHTTP(ctx context.Context, t *testing.T, url string, diagnose ...func() string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			why := ""
			for _, d := range diagnose {
				why += "\n" + d()
			}
			t.Fatalf("%s: no answer after 60 s: %v%s", url, err, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// invokerInitEnv is the env of an /init as OpenWhisk's invoker sends it
// (ContainerProxy, apache/openwhisk): the action's init parameters and the
// __OW_* fields of the activation that caused the cold start, all strings
// (__OW_API_KEY only for an action with provide-api-key, as here).
func invokerInitEnv(apiKey, action string, params map[string]string) map[string]string {
	env := map[string]string{
		"__OW_API_KEY": apiKey, "__OW_NAMESPACE": "guest", "__OW_ACTION_NAME": "/guest/" + action,
		"__OW_ACTION_VERSION": "0.0.1", "__OW_ACTIVATION_ID": "coldstart" + action, "__OW_TRANSACTION_ID": "tid-coldstart",
		"__OW_DEADLINE": strconv.FormatInt(time.Now().Add(60*time.Second).UnixMilli(), 10),
	}
	for k, v := range params {
		env[k] = v
	}
	return env
}

// initCpuBurn sends the action pod at base its /init, as the invoker does:
// the samples' CPU-bound action.
func initCpuBurn(ctx context.Context, t *testing.T, base string, jar []byte, api *fakeOpenWhiskAPI) {
	t.Helper()
	r, err := post(ctx, base+"/init", map[string]any{"value": map[string]any{
		"name": "cpuburn", "main": "dev.cpuslot.samples.CpuBurn", "binary": true,
		"code": base64.StdEncoding.EncodeToString(jar), "env": invokerInitEnv(api.apiKey, "cpuburn", nil),
	}})
	if err != nil || r.status != 200 {
		t.Fatalf("/init: %v %d %s", err, r.status, r.body)
	}
}

// cpuShare is a CPU-bound invocation's share of a CPU, from the runtime's
// report headers (slot CPU time) and the function's own wall time.
func cpuShare(r invokeResult) (share float64, quota int, err error) {
	quota, err = strconv.Atoi(r.headers.Get("X-Cpuslot-Quota-Milli"))
	if err != nil {
		return 0, 0, fmt.Errorf("X-Cpuslot-Quota-Milli %q: %v", r.headers.Get("X-Cpuslot-Quota-Milli"), err)
	}
	share, _, err = cluster.ActivationShare(r.headers, r.body)
	return share, quota, err
}

// waitAnnotationQuota sends /run, one at a time (run(0), run(1), ...),
// until one runs with the quota of the action's annotation, and returns how
// many it took. An /init with the cold start's __OW_* fields answers once
// the lookup it starts is in, within the lookup's budget; no /run waits for
// it: past that budget, the first activations run with the next quota
// source while the lookup runs in the background.
func waitAnnotationQuota(t *testing.T, run func(i int) (invokeResult, error)) int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; ; i++ {
		r, err := run(i)
		if err != nil || r.status != 200 {
			t.Fatalf("/run: %v %d %s", err, r.status, r.body)
		}
		if r.headers.Get("X-Cpuslot-Quota-Source") == "annotation" {
			return i + 1
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d /run the runtime still had not read the action's annotation (quota %q from %q)",
				i+1, r.headers.Get("X-Cpuslot-Quota-Milli"), r.headers.Get("X-Cpuslot-Quota-Source"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOpenWhiskActionPod: an action pod shaped as OpenWhisk's invoker makes
// it is served by the agent; the test drives it as the invoker does: one
// actionPodName is the action pod the OpenWhisk invoker would create.
const actionPodName = "wskowdev-invoker-00-1-guest-cpuburn"

// startActionPod creates an OpenWhisk action pod on the runtime image in
// appNS (pointed at the stand-in OpenWhisk API), waits until it is Ready
// and served by the agent, and returns its base URL and slot directories.
// edits change the pod's manifest (a map of its YAML) before it is applied.
func startActionPod(ctx context.Context, t *testing.T, c *cluster.Cluster, agentNS, appNS string, api *fakeOpenWhiskAPI, edits ...func(pod map[string]any)) (string, []string) {
	t.Helper()
	manifest := fmt.Sprintf(openWhiskActionPod, appNS, runtimeImage, api.url)
	if len(edits) > 0 {
		var pod map[string]any
		if err := yaml.Unmarshal([]byte(manifest), &pod); err != nil {
			t.Fatal(err)
		}
		for _, e := range edits {
			e(pod)
		}
		b, err := yaml.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		manifest = string(b)
	}
	if out, err := c.Apply(ctx, manifest); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := c.Kubectl(ctx, "-n", appNS, "wait", "--for=condition=Ready", "pod/"+actionPodName, "--timeout=120s"); err != nil {
		desc, _ := c.Kubectl(ctx, "-n", appNS, "describe", "pod", actionPodName)
		t.Fatalf("%v: %s\n%s", err, out, desc)
	}
	_, slots := waitServed(ctx, t, c, agentNS, appNS, actionPodName, "user-action", 1)
	base := "http://" + podIP(ctx, t, c, appNS, actionPodName) + ":8080"
	waitHTTP(ctx, t, base+"/", func() string {
		desc, _ := c.Kubectl(ctx, "-n", appNS, "describe", "pod", actionPodName)
		logs, _ := c.Kubectl(ctx, "-n", appNS, "logs", actionPodName, "-c", "user-action", "--tail=100")
		prev, _ := c.Kubectl(ctx, "-n", appNS, "logs", actionPodName, "-c", "user-action", "--previous", "--tail=100")
		return "pod:\n" + desc + "\nlog:\n" + logs + "\nprevious container's log:\n" + prev
	})
	return base, slots
}

// /init with the jar, then concurrent /run (intra-container concurrency)
// with the activation fields; the quota comes from the action's cpu-quota
// annotation read from the (stand-in) OpenWhisk API; every invocation runs
// in a slot, and a CPU-bound one at 250m gets 25 % +/- 2.5 points.
func TestOpenWhiskActionPod(t *testing.T) {
	c := cluster.Need(t, kc)
	needRuntimeImage(t)
	jar := samplesJar(t)
	const ns, appNS, release = "cpuslot-system", "e2e-openwhisk", "cpuslot"
	installChart(t, c, release, ns)
	namespace(t, c, appNS)
	api := startFakeOpenWhiskAPI(t, c)
	api.quota["cpuburn"] = "250m"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	base, slots := startActionPod(ctx, t, c, ns, appNS, api)
	t.Logf("action pod served: %d pre-warmed slots in its user-action container's cgroup", len(slots))

	initCpuBurn(ctx, t, base, jar, api)
	r, _ := post(ctx, base+"/init", map[string]any{"value": map[string]any{"name": "cpuburn", "main": "x", "code": "", "binary": true}})
	if r.status == 200 {
		t.Errorf("a second /init succeeded: %s", r.body)
	}

	run := func(ctx context.Context, i int, ms int) (invokeResult, error) {
		return post(ctx, base+"/run", map[string]any{
			"value":          map[string]any{"ms": ms, "threads": 1},
			"namespace":      "guest",
			"action_name":    "/guest/cpuburn",
			"action_version": "0.0.1",
			"activation_id":  fmt.Sprintf("e2e%029d", i),
			"transaction_id": fmt.Sprintf("tid%d", i),
			"deadline":       strconv.FormatInt(time.Now().Add(60*time.Second).UnixMilli(), 10),
			"api_key":        api.apiKey,
		})
	}
	// Concurrent /run, as the invoker sends with concurrency > 1: the
	// first batch right after /init's answer (a cold start: the runtime's
	// slot client is cold, and the invoker sends the activations queued
	// for the new container at once), then a second one. Every one at the
	// annotation's quota in a slot: /init answers once the runtime has
	// read the annotation it started reading with the init's __OW_* fields.
	const conc = 4
	for batch, what := range []string{"first (cold)", "second"} {
		var wg sync.WaitGroup
		results := make([]invokeResult, conc)
		errs := make([]error, conc)
		for i := 0; i < conc; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				results[i], errs[i] = run(ctx, batch*conc+i, 200)
			}(i)
		}
		wg.Wait()
		var slots []string
		for i, r := range results {
			if errs[i] != nil || r.status != 200 {
				t.Fatalf("/run %d: %v %d %s", i, errs[i], r.status, r.body)
			}
			q, src := r.headers.Get("X-Cpuslot-Quota-Milli"), r.headers.Get("X-Cpuslot-Quota-Source")
			if q != "250" || src != "annotation" {
				t.Errorf("%s batch, /run %d: quota %q from %q, want 250 from the action annotation", what, i, q, src)
			}
			if r.headers.Get("X-Cpuslot-Slot") == "" {
				t.Errorf("%s batch, /run %d: ran without a slot (X-Cpuslot-Noslot: %q) after %v", what, i, r.headers.Get("X-Cpuslot-Noslot"), r.elapsed.Round(time.Millisecond))
			}
			slots = append(slots, r.headers.Get("X-Cpuslot-Slot")+"/"+r.headers.Get("X-Cpuslot-Outcome")+r.headers.Get("X-Cpuslot-Noslot"))
		}
		t.Logf("%s batch of %d concurrent /run: slot/outcome %v", what, conc, slots)
	}

	// A CPU-bound invocation alone at 250m: 25 % +/- 2.5 points.
	for try := 1; ; try++ {
		r, err := run(ctx, 100+try, 3000)
		if err != nil || r.status != 200 {
			t.Fatalf("/run: %v %d %s", err, r.status, r.body)
		}
		share, quota, err := cpuShare(r)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("CPU-bound invocation at %dm: %.1f%% of a CPU (throttled %s ns)", quota, 100*share, r.headers.Get("X-Cpuslot-Throttled-Ns"))
		if share > 0.275 {
			t.Fatalf("%.1f%% of a CPU at 250m: above the cap", 100*share)
		}
		if share >= 0.225 {
			break
		}
		if try == 3 {
			t.Fatalf("%.1f%% of a CPU at 250m after 3 tries (machine busy?)", 100*share)
		}
	}
	api.mu.Lock()
	gets := api.gets
	api.mu.Unlock()
	if gets != 1 {
		t.Errorf("the runtime read the action's annotations %d times, want once (at /init, for every activation of its version)", gets)
	}
	logs, _ := c.Kubectl(ctx, "-n", appNS, "logs", actionPodName, "--tail=5")
	if !strings.Contains(logs, "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX") {
		t.Errorf("no activation sentinel in the action's log:\n%s", logs)
	}
}
