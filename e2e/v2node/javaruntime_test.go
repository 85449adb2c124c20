package v2node

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
	"github.com/cpuslot/cpuslot/test/vm"
)

// The Java runtime on the v2 node: the image OpenWhisk's java kind maps to
// (runtime-java: the runtime without the JavaScript and Python engines, so
// that an emulated node imports and starts it in reasonable time), in the
// two pod shapes the agent serves by shape, with no cpuslot annotation:
//
//   - OpenWhisk: label user-action-pod=true, container user-action, as the
//     invoker makes it (deploy/openwhisk/action-pod.example.yaml), driven
//     as the invoker drives it (/init, concurrent /run); the action's
//     cpu-quota annotation comes from a stand-in of the OpenWhisk API: a
//     static file served in the guest (pods reach the node's address);
//   - Knative: label serving.knative.dev/revision, container
//     user-container beside a queue-proxy container listed first (the
//     agent must pick user-container by name), driven with Knative's
//     request (init in the body, revision headers), the quota from the
//     revision's pod default (CPUSLOT_DEFAULT_QUOTA).
//
// Requests go from the guest (pod IPs are routed there only).
const (
	owPod     = "wskowdev-invoker-00-1-guest-cpuburn"
	knPod     = "fn-00001-deployment-5d8f9c7b6d-x2v9q"
	knRev     = "fn-00001"
	javaDir   = stateDir + "/java"
	owAPIUnit = "v2node-openwhisk-api.service"
	owAPIPort = 8091
	javaLoad  = "v2node-java-load.service"
	owAPIKey  = "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP"
)

func javaPods() string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: default
  labels:
    invoker: invoker0
    name: %[1]s
    release: owdev
    user-action-pod: "true"
  annotations:
    prometheus.io/port: "9102"
    prometheus.io/scrape: "true"
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 5
  containers:
  - name: user-action
    image: %[3]s
    imagePullPolicy: Never
    env:
    - name: __OW_API_HOST
      value: http://%[4]s:%[5]d
    - name: __OW_ALLOW_CONCURRENT
      value: "true"
    - name: CPUSLOT_SOCKET
      value: /run/cpuslot/agent.sock
    ports:
    - {containerPort: 8080, name: action}
    resources:
      limits: {cpu: "1", memory: 384Mi}
      requests: {cpu: 250m, memory: 384Mi}
    securityContext:
      capabilities:
        drop: [NET_RAW, NET_ADMIN]
    volumeMounts:
    - {mountPath: /run/cpuslot, name: cpuslot}
  volumes:
  - name: cpuslot
    emptyDir: {}
---
apiVersion: v1
kind: Pod
metadata:
  name: %[2]s
  namespace: default
  labels:
    serving.knative.dev/configuration: fn
    serving.knative.dev/revision: %[6]s
    serving.knative.dev/service: fn
  annotations:
    cpuslot.dev/cpu-quota: "250m"
    cpuslot.dev/prewarm: "250m=2"
    prometheus.io/port: "9102"
    prometheus.io/scrape: "true"
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: queue-proxy
    image: %[7]s
    imagePullPolicy: Never
    args: ["serve", "-addr", ":8012"]
    resources:
      limits: {cpu: 100m, memory: 32Mi}
      requests: {cpu: 25m, memory: 32Mi}
  - name: user-container
    image: %[3]s
    imagePullPolicy: Never
    env:
    - name: CPUSLOT_SOCKET
      value: /run/cpuslot/agent.sock
    - name: CPUSLOT_DEFAULT_QUOTA
      valueFrom:
        fieldRef:
          fieldPath: metadata.annotations['cpuslot.dev/cpu-quota']
    - name: CPUSLOT_LOG
      value: stderr
    ports:
    - containerPort: 8080
    resources:
      limits: {cpu: "1", memory: 384Mi}
      requests: {cpu: 250m, memory: 384Mi}
    volumeMounts:
    - {mountPath: /run/cpuslot, name: cpuslot}
  volumes:
  - name: cpuslot
    emptyDir: {}
`, owPod, knPod, cluster.RuntimeJavaImage, vm.GuestIP, owAPIPort, knRev, cluster.ProbeImage)
}

// javaRuntimePods starts both pods and checks each is served in its
// function container's systemd scope, runs its invocations in slots at the
// quota its platform gives, and holds a CPU-bound one at 250m to 25 % +/-
// 2.5 points. The pods stay, with a light load of invocations from the
// guest, for PrometheusQueries (the runtime dashboard's series);
// endJava removes them.
func (f *served) javaRuntimePods(t *testing.T) {
	ctx := f.ctx(t, 20*time.Minute)
	t0 := time.Now()
	tar := filepath.Join(f.n.RepoDir(), "bin", "cpuslot-runtime-java.tar")
	if err := f.n.ImportImage(ctx, tar); err != nil {
		t.Fatalf("%v (make images writes it: make runtime-image)", err)
	}
	t.Logf("runtime-java image imported in %v (emulated node)", time.Since(t0).Round(time.Second))

	// The OpenWhisk API stand-in: the action's record, as the real API
	// answers GET /api/v1/namespaces/guest/actions/cpuburn (the runtime
	// sends the activation's api_key; the stand-in does not check it).
	f.java = true
	record := `{"namespace":"guest","name":"cpuburn","version":"0.0.1","annotations":[{"key":"exec","value":"java:cpuslot"},{"key":"cpu-quota","value":"250m"}]}`
	jar := samplesJar(t, f.n.RepoDir())
	guest(t, ctx, f.n, fmt.Sprintf(`set -e
mkdir -p %[1]s/api/v1/namespaces/guest/actions
printf '%%s' '%[2]s' > %[1]s/api/v1/namespaces/guest/actions/cpuburn
code=$(base64 -w0 %[3]s)
printf '{"value":{"name":"cpuburn","main":"dev.cpuslot.samples.CpuBurn","binary":true,"code":"%%s","env":{}}}' "$code" > %[1]s/ow-init.json
printf '{"activation":{"namespace":"default","action_name":"%[4]s","activation_id":"kn-init"},"value":{"ms":1,"threads":1},"init":{"name":"cpuburn","main":"dev.cpuslot.samples.CpuBurn","binary":true,"code":"%%s"}}' "$code" > %[1]s/kn-init.json
systemd-run --unit=%[5]s -p DefaultDependencies=no -p StandardOutput=append:%[6]s/openwhisk-api.log -p StandardError=append:%[6]s/openwhisk-api.log \
	/usr/bin/python3 -m http.server --bind %[7]s --directory %[1]s %[8]d
`, javaDir, record, jar, knRev, owAPIUnit, logDir, vm.GuestIP, owAPIPort))

	t1 := time.Now()
	if _, err := f.n.Kubectl(ctx, "apply", "-f", writeManifest(t, javaPods())); err != nil {
		t.Fatal(err)
	}
	for _, pod := range []string{owPod, knPod} {
		if _, err := f.n.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/"+pod, "--timeout=10m"); err != nil {
			desc, _ := f.n.Kubectl(ctx, "describe", "pod", pod)
			t.Fatalf("%v\n%s\nnode:\n%s", err, desc, f.n.Diagnose(ctx))
		}
	}
	t.Logf("both Java runtime pods Ready %v after kubectl apply (emulated node)", time.Since(t1).Round(time.Second))

	// Served by shape, in the function container's scope: OpenWhisk's
	// runtime pre-warms nothing by annotation (the agent's default set),
	// the Knative revision two 250m slots.
	for _, c := range []struct{ pod, container string }{{owPod, "user-action"}, {knPod, "user-container"}} {
		scope, uid := namedContainerScope(t, ctx, f.n, c.pod, c.container)
		slots := f.waitSlots(t, ctx, uid, scope, 1)
		types := map[string]int{}
		for _, v := range slots {
			types[v[strings.LastIndex(v, " ")+1:]]++
		}
		if types["threaded"] != len(slots) {
			t.Errorf("%s: slots %v, want all threaded", c.pod, slots)
		}
		if typ := guest(t, ctx, f.n, "cat "+scope+"/cgroup.type"); typ != "domain threaded" {
			t.Errorf("%s/%s: scope cgroup.type %q, want domain threaded", c.pod, c.container, typ)
		}
		t.Logf("%s served in its %s container's scope %s: %v", c.pod, c.container, path.Base(scope), slots)
	}
	if qp, _ := namedContainerScope(t, ctx, f.n, knPod, "queue-proxy"); guest(t, ctx, f.n, "ls -d "+qp+"/cpuslot-* 2>/dev/null | wc -l") != "0" {
		t.Errorf("the Knative pod's queue-proxy container got slots")
	}

	ow := "http://" + podIPOf(t, ctx, f.n, owPod) + ":8080"
	kn := "http://" + podIPOf(t, ctx, f.n, knPod) + ":8080"
	deadline := strconv.FormatInt(time.Now().Add(2*time.Hour).UnixMilli(), 10)
	owRun := func(id string, ms int) string {
		return fmt.Sprintf(`{"value":{"ms":%d,"threads":1},"namespace":"guest","action_name":"/guest/cpuburn","action_version":"0.0.1","activation_id":"%s","transaction_id":"t%s","deadline":"%s","api_key":"%s"}`,
			ms, id, id, deadline, owAPIKey)
	}
	knRun := func(id string, ms int) string {
		return fmt.Sprintf(`{"activation":{"namespace":"default","action_name":"%s","activation_id":"%s"},"value":{"ms":%d,"threads":1}}`, knRev, id, ms)
	}
	knHdr := []string{"Knative-Serving-Namespace: default", "Knative-Serving-Revision: " + knRev}
	// Ready is the container started: wait until each JVM answers at all.
	t2 := time.Now()
	if out, code, err := f.n.Exec(ctx, fmt.Sprintf(`for u in %s %s; do
	for i in $(seq 600); do curl -s -o /dev/null -m 10 $u/ && continue 2; sleep 1; done
	echo "$u: no answer after 600 tries"; exit 1
done`, ow, kn)); err != nil || code != 0 {
		logs, _ := f.n.Kubectl(ctx, "logs", owPod, "--tail=20")
		t.Fatalf("the runtimes do not answer HTTP: %v %s\n--- %s log:\n%s", err, out, owPod, logs)
	}
	t.Logf("both runtimes answer HTTP %v after both pods were Ready", time.Since(t2).Round(time.Second))

	// OpenWhisk: /init once (a second is refused), then /run until the
	// action's annotation is in (the runtime never waits for the lookup),
	// then four at once.
	if a := guestPosts(t, ctx, f.n, []guestReq{{url: ow + "/init", file: javaDir + "/ow-init.json"}})[0]; a.status != 200 {
		t.Fatalf("OpenWhisk /init: %d %s", a.status, a.body)
	}
	if a := guestPosts(t, ctx, f.n, []guestReq{{url: ow + "/init", file: javaDir + "/ow-init.json"}})[0]; a.status == 200 {
		t.Errorf("a second OpenWhisk /init succeeded: %s", a.body)
	}
	for i := 0; ; i++ {
		a := guestPosts(t, ctx, f.n, []guestReq{{url: ow + "/run", body: owRun(fmt.Sprintf("ow%d", i), 1)}})[0]
		if a.status != 200 {
			t.Fatalf("OpenWhisk /run: %d %s", a.status, a.body)
		}
		if a.headers.Get("X-Cpuslot-Quota-Source") == "annotation" {
			t.Logf("OpenWhisk: the action's annotation applies from /run %d", i+1)
			break
		}
		if i == 120 {
			logs, _ := f.n.Kubectl(ctx, "logs", owPod, "--tail=20")
			t.Fatalf("OpenWhisk: after %d /run the runtime had not read the action's annotation (quota %q from %q)\n%s\n--- stand-in API log:\n%s",
				i+1, a.headers.Get("X-Cpuslot-Quota-Milli"), a.headers.Get("X-Cpuslot-Quota-Source"), logs,
				guest(t, ctx, f.n, "tail -n 5 "+logDir+"/openwhisk-api.log; true"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Knative: the first request carries the init.
	if a := guestPosts(t, ctx, f.n, []guestReq{{url: kn + "/", file: javaDir + "/kn-init.json", headers: knHdr}})[0]; a.status != 200 {
		t.Fatalf("Knative first request: %d %s", a.status, a.body)
	}
	for _, p := range []struct {
		name, source string
		req          func(i int) guestReq
	}{
		{"OpenWhisk", "annotation", func(i int) guestReq { return guestReq{url: ow + "/run", body: owRun(fmt.Sprintf("owc%d", i), 200)} }},
		{"Knative", "default", func(i int) guestReq {
			return guestReq{url: kn + "/", body: knRun(fmt.Sprintf("knc%d", i), 200), headers: knHdr}
		}},
	} {
		var reqs []guestReq
		for i := 0; i < 4; i++ {
			reqs = append(reqs, p.req(i))
		}
		var got []string
		for i, a := range guestPosts(t, ctx, f.n, reqs) {
			if a.status != 200 {
				t.Fatalf("%s: concurrent request %d: %d %s", p.name, i, a.status, a.body)
			}
			q, src := a.headers.Get("X-Cpuslot-Quota-Milli"), a.headers.Get("X-Cpuslot-Quota-Source")
			if q != "250" || src != p.source {
				t.Errorf("%s: request %d ran at quota %q from %q, want 250 from %s", p.name, i, q, src, p.source)
			}
			if a.headers.Get("X-Cpuslot-Slot") == "" {
				t.Errorf("%s: request %d ran without a slot (X-Cpuslot-Noslot %q)", p.name, i, a.headers.Get("X-Cpuslot-Noslot"))
			}
			got = append(got, a.headers.Get("X-Cpuslot-Slot")+"/"+a.headers.Get("X-Cpuslot-Outcome")+a.headers.Get("X-Cpuslot-Noslot"))
		}
		t.Logf("%s: 4 concurrent invocations, slot/outcome %v", p.name, got)
		// A CPU-bound invocation alone at 250m: 25 % +/- 2.5 points (the
		// lower bound only when the node let it run: up to three tries).
		for try := 1; ; try++ {
			req := p.req(100 + try)
			if p.name == "OpenWhisk" {
				req.body = owRun(fmt.Sprintf("owburn%d", try), 3000)
			} else {
				req.body = knRun(fmt.Sprintf("knburn%d", try), 3000)
			}
			a := guestPosts(t, ctx, f.n, []guestReq{req})[0]
			if a.status != 200 {
				t.Fatalf("%s: CPU-bound invocation: %d %s", p.name, a.status, a.body)
			}
			share, err := cpuShare(a)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: CPU-bound invocation at 250m: %.1f%% of a CPU (throttled %s ns)", p.name, 100*share, a.headers.Get("X-Cpuslot-Throttled-Ns"))
			if share > 0.275 {
				t.Errorf("%s: %.1f%% of a CPU at 250m: above the cap", p.name, 100*share)
				break
			}
			if share >= 0.225 {
				break
			}
			if try == 3 {
				t.Errorf("%s: %.1f%% of a CPU at 250m after 3 tries (node busy?)", p.name, 100*share)
				break
			}
		}
	}
	if logs, _ := f.n.Kubectl(ctx, "logs", owPod, "--tail=50"); !strings.Contains(logs, "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX") {
		t.Errorf("no activation sentinel in the OpenWhisk action's log:\n%s", logs)
	}

	// A light load for PrometheusQueries: one invocation of each pod every
	// half second, from a guest unit endJava stops.
	guest(t, ctx, f.n, fmt.Sprintf(`set -e
printf '%%s' '%[1]s' > %[3]s/ow-load.json
printf '%%s' '%[2]s' > %[3]s/kn-load.json
systemd-run --unit=%[4]s -p DefaultDependencies=no -p StandardOutput=null -p StandardError=null /bin/bash -c '
while true; do
	curl -s -m 30 -o /dev/null -H "Content-Type: application/json" --data-binary @%[3]s/ow-load.json %[5]s/run
	curl -s -m 30 -o /dev/null -H "Content-Type: application/json" -H "Knative-Serving-Namespace: default" -H "Knative-Serving-Revision: %[6]s" --data-binary @%[3]s/kn-load.json %[7]s/
	sleep 0.5
done'`, owRun("owload", 5), knRun("knload", 5), javaDir, javaLoad, ow, knRev, kn))
	t.Logf("step took %v", time.Since(t0).Round(time.Second))
}

// endJava stops the load and the OpenWhisk API stand-in and deletes the
// Java runtime pods: their slots go with them.
func (f *served) endJava(t *testing.T) {
	if !f.java {
		return
	}
	f.java = false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 5*time.Minute)
	defer cancel()
	if out, err := f.n.MustExec(ctx, fmt.Sprintf("for u in %s %s; do systemctl stop $u; systemctl reset-failed $u; done 2>/dev/null; rm -rf %s; true", javaLoad, owAPIUnit, javaDir)); err != nil {
		t.Errorf("stopping the Java load: %v: %s", err, out)
	}
	if _, err := f.n.Kubectl(ctx, "delete", "pod", owPod, knPod, "--ignore-not-found", "--wait=true", "--timeout=4m"); err != nil {
		t.Errorf("deleting the Java runtime pods: %v", err)
	}
}

// namedContainerScope is containerScope for the named container of a pod
// in the default namespace: its scope (a guest path) and the pod's UID.
func namedContainerScope(t *testing.T, ctx context.Context, n *Node, pod, container string) (scope, uid string) {
	t.Helper()
	out, err := n.Kubectl(ctx, "get", "pod", pod, "-o", `jsonpath={.metadata.uid} {.status.qosClass} {.status.containerStatuses[?(@.name=="`+container+`")].containerID}`)
	if err != nil {
		t.Fatal(err)
	}
	var qos, cid string
	if _, err := fmt.Sscan(out, &uid, &qos, &cid); err != nil {
		t.Fatalf("pod %s status %q: %v", pod, out, err)
	}
	id, ok := strings.CutPrefix(cid, "containerd://")
	if !ok {
		t.Fatalf("container ID %q is not containerd's", cid)
	}
	return podSlicePath(uid, qos) + "/cri-containerd-" + id + ".scope", uid
}

func podIPOf(t *testing.T, ctx context.Context, n *Node, pod string) string {
	t.Helper()
	ip, err := n.Kubectl(ctx, "get", "pod", pod, "-o", "jsonpath={.status.podIP}")
	if err != nil || ip == "" {
		t.Fatalf("pod IP of %s: %v %q", pod, err, ip)
	}
	return ip
}

func samplesJar(t *testing.T, repo string) string {
	t.Helper()
	jars, _ := filepath.Glob(filepath.Join(repo, "runtime-image", "samples", "target", "samples-*.jar"))
	if len(jars) == 0 {
		t.Fatal("runtime-image/samples/target/samples-*.jar missing (make images builds it)")
	}
	return jars[0]
}

// guestReq is a POST of a JSON body (inline, or a guest file) from the
// guest; guestAnswer its answer.
type guestReq struct {
	url, body, file string
	headers         []string
}

type guestAnswer struct {
	status  int
	headers http.Header
	body    []byte
}

// guestPosts sends the requests at once from the guest (one curl each, in
// the background) and returns their answers in order.
func guestPosts(t *testing.T, ctx context.Context, n *Node, reqs []guestReq) []guestAnswer {
	t.Helper()
	var script strings.Builder
	script.WriteString("d=$(mktemp -d)\n")
	for i, r := range reqs {
		data := r.file
		if data == "" {
			data = fmt.Sprintf("$d/req%d", i)
			fmt.Fprintf(&script, "cat > %s <<'EOF'\n%s\nEOF\n", data, r.body)
		}
		fmt.Fprintf(&script, "curl -sS -m 300 -D $d/h%d -o $d/b%d -H 'Content-Type: application/json'", i, i)
		for _, h := range r.headers {
			fmt.Fprintf(&script, " -H '%s'", h)
		}
		fmt.Fprintf(&script, " --data-binary @%s '%s' 2>$d/e%d &\n", data, r.url, i)
	}
	script.WriteString("wait\n")
	for i := range reqs {
		fmt.Fprintf(&script, "echo '@@answer %d'; cat $d/e%d; echo '@@headers'; tr -d '\\r' < $d/h%d; echo '@@body'; cat $d/b%d; echo\n", i, i, i, i)
	}
	script.WriteString("rm -rf $d\n")
	out := guest(t, ctx, n, script.String())
	answers := make([]guestAnswer, len(reqs))
	parts := strings.Split(out, "@@answer ")
	for _, p := range parts[1:] {
		idx, rest, _ := strings.Cut(p, "\n")
		i, err := strconv.Atoi(idx)
		if err != nil || i < 0 || i >= len(reqs) {
			t.Fatalf("guest curl output: %q", out)
		}
		errs, rest, _ := strings.Cut(rest, "@@headers\n")
		hdrs, body, _ := strings.Cut(rest, "@@body\n")
		a := guestAnswer{headers: http.Header{}, body: []byte(strings.TrimSpace(body))}
		sc := bufio.NewScanner(strings.NewReader(hdrs))
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "HTTP/") {
				// The last status line wins (100 Continue first).
				if f := strings.Fields(line); len(f) >= 2 {
					a.status, _ = strconv.Atoi(f[1])
				}
				continue
			}
			if k, v, ok := strings.Cut(line, ":"); ok {
				a.headers.Add(strings.TrimSpace(k), strings.TrimSpace(v))
			}
		}
		if a.status == 0 {
			t.Fatalf("%s: no answer: %s", reqs[i].url, strings.TrimSpace(errs))
		}
		answers[i] = a
	}
	return answers
}

// cpuShare is a CPU-bound invocation's share of a CPU: the slot CPU time
// the runtime reports over the function's own wall time.
func cpuShare(a guestAnswer) (float64, error) {
	cpu, err := strconv.ParseInt(a.headers.Get("X-Cpuslot-Cpu-Ns"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("X-Cpuslot-Cpu-Ns %q: %v", a.headers.Get("X-Cpuslot-Cpu-Ns"), err)
	}
	var body struct {
		WallMS float64 `json:"wall_ms"`
	}
	if err := json.Unmarshal(a.body, &body); err != nil || body.WallMS <= 0 {
		return 0, fmt.Errorf("reply %s: no wall_ms", a.body)
	}
	return float64(cpu) / (body.WallMS * 1e6), nil
}
