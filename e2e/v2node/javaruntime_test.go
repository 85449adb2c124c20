package v2node

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
	"github.com/cpuslot/cpuslot/test/vm"
)

// The Java runtime on the v2 node, and the two pod shapes the agent serves
// by shape, with no cpuslot annotation:
//
//   - OpenWhisk: label user-action-pod=true, container user-action, as the
//     invoker makes it (deploy/openwhisk/action-pod.example.yaml), on the
//     Java runtime: the image OpenWhisk's java kind maps to (runtime-java:
//     the runtime without the JavaScript and Python engines, which an
//     emulated node imports and starts in minutes), driven as the invoker
//     drives it (/init, /run); the action's cpu-quota annotation comes from
//     a stand-in of the OpenWhisk API: a static file served in the guest
//     (pods reach the node's address);
//   - Knative: label serving.knative.dev/revision, container
//     user-container beside a queue-proxy container listed first (the
//     agent must pick user-container by name), on the Go probe invoking
//     through the agent. The Java runtime's Knative protocol runs against
//     the real Knative on the v1 node; what is node-specific, the slots in
//     the container's systemd scope and the slot client in them, is the
//     same for both shapes, and a second JVM would double the longest
//     part of this step on the emulated node (its start).
//
// Requests go from the guest (pod IPs are routed there only).
const (
	owPod      = "wskowdev-invoker-00-1-guest-cpuburn"
	knPod      = "fn-00001-deployment-5d8f9c7b6d-x2v9q"
	javaTar    = "cpuslot-runtime-java.tar" // in bin/ (make runtime-image)
	importUnit = "v2node-import-java.service"
	knRev      = "fn-00001"
	javaDir    = stateDir + "/java"
	owAPIUnit  = "v2node-openwhisk-api.service"
	owAPIPort  = 8091
	javaLoad   = "v2node-java-load.service"
	owAPIKey   = "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP"
)

// coldStartEnv is the env of an /init as OpenWhisk's invoker sends it
// (ContainerProxy): the __OW_* fields of the activation that caused the
// cold start, all strings (__OW_API_KEY: the action has provide-api-key).
func coldStartEnv() string {
	b, _ := json.Marshal(map[string]string{
		"__OW_API_KEY": owAPIKey, "__OW_NAMESPACE": "guest", "__OW_ACTION_NAME": "/guest/cpuburn",
		"__OW_ACTION_VERSION": "0.0.1", "__OW_ACTIVATION_ID": "ow0", "__OW_TRANSACTION_ID": "tow0",
		"__OW_DEADLINE": strconv.FormatInt(time.Now().Add(2*time.Hour).UnixMilli(), 10),
	})
	return string(b)
}

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
    # As on the legacy node: four concurrent /run must each get a slot,
    # and the emulated node's agent may answer a miss after the default
    # 50 ms acquire budget.
    - name: CPUSLOT_ACQUIRE_BUDGET_MS
      value: "5000"
    # The annotation read's budget, which OpenWhisk's /init waits for:
    # a cold JVM's first HTTP request on the emulated node may take longer
    # than the default 2 s.
    - name: CPUSLOT_ANNOTATION_TIMEOUT_MS
      value: "30000"
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
    cpuslot.dev/prewarm: "250m=2"
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
    image: %[7]s
    imagePullPolicy: Never
    args: ["invoke", "-quota", "250m"]
    env:
    - name: CPUSLOT_SOCKET
      value: /run/cpuslot/agent.sock
    ports:
    - containerPort: 8080
    resources:
      limits: {cpu: 500m, memory: 64Mi}
      requests: {cpu: 100m, memory: 32Mi}
    volumeMounts:
    - {mountPath: /run/cpuslot, name: cpuslot}
  volumes:
  - name: cpuslot
    emptyDir: {}
`, owPod, knPod, cluster.RuntimeJavaImage, vm.GuestIP, owAPIPort, knRev, cluster.ProbeImage)
}

// startJavaImport imports the runtime-java image into the node's
// containerd in the background (a guest unit): the import is the longest
// part of JavaRuntimePods on the emulated node (minutes), and overlaps the
// steps before it (none may restart containerd). javaRuntimePods waits for
// it.
func startJavaImport(t *testing.T, ctx context.Context, n *Node) {
	t.Helper()
	tar := filepath.Join(n.RepoDir(), "bin", javaTar)
	// make e2e builds the runtime's images beside the node's start
	// (hack/e2e.sh); the tarball appears whole when its build is done.
	start := time.Now()
	for {
		_, err := os.Stat(tar)
		if err == nil {
			break
		}
		if !os.IsNotExist(err) || time.Since(start) > 30*time.Minute || ctx.Err() != nil {
			t.Fatalf("%v (make images-runtime writes it; make e2e builds it beside this node's start)", err)
		}
		time.Sleep(2 * time.Second)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Logf("waited %v for %s (built beside the node's start)", waited.Round(time.Second), javaTar)
	}
	guest(t, ctx, n, fmt.Sprintf(`systemd-run --unit=%s -p DefaultDependencies=no -p Type=oneshot -p RemainAfterExit=yes --no-block \
	-p StandardOutput=append:%s/import-java.log -p StandardError=append:%[2]s/import-java.log \
	%s -a %s -n k8s.io images import %s`, importUnit, logDir, filepath.Join(n.bins.containerd, "ctr"), ContainerdSocket, tar))
}

// waitJavaImport waits until the background import has ended, and fails
// unless it succeeded.
func waitJavaImport(t *testing.T, ctx context.Context, n *Node) {
	t.Helper()
	// (systemctl show prints properties in its own order: one at a time.)
	out, code, err := n.Exec(ctx, fmt.Sprintf(`for i in $(seq 1200); do
	a=$(systemctl show -p ActiveState --value %[1]s); r=$(systemctl show -p Result --value %[1]s)
	[ "$a" = active ] && [ "$r" = success ] && exit 0
	[ "$a" = failed ] || { [ -n "$r" ] && [ "$r" != success ]; } && break
	sleep 1
done
echo "import unit: $a $r"; tail -n 20 %[2]s/import-java.log; exit 1`, importUnit, logDir))
	if err != nil || code != 0 {
		t.Fatalf("importing %s: %v %s", javaTar, err, out)
	}
}

// javaRuntimePods starts both pods and checks each is served in its
// function container's systemd scope (and only there); the OpenWhisk
// action's invocations run in slots at its annotation's quota, and a
// CPU-bound one at 250m gets 25 % +/- 2.5 points; the Knative-shaped
// pod's invocations run in slots. The action pod stays, with a light load
// of invocations from the guest, for PrometheusQueries (the runtime
// dashboard's series); endJava removes both.
func (f *served) javaRuntimePods(t *testing.T) {
	ctx := f.ctx(t, 20*time.Minute)
	t0 := time.Now()
	f.java = true
	waitJavaImport(t, ctx, f.n)
	t.Logf("runtime-java image imported (in the background since QuotaHolds) %v after the step began", time.Since(t0).Round(time.Second))

	// The OpenWhisk API stand-in: the action's record, as the real API
	// answers GET /api/v1/namespaces/guest/actions/cpuburn (the runtime
	// sends the activation's api_key; the stand-in does not check it).
	record := `{"namespace":"guest","name":"cpuburn","version":"0.0.1","annotations":[{"key":"exec","value":"java:cpuslot"},{"key":"cpu-quota","value":"250m"}]}`
	guest(t, ctx, f.n, fmt.Sprintf(`set -e
mkdir -p %[1]s/api/v1/namespaces/guest/actions
printf '%%s' '%[2]s' > %[1]s/api/v1/namespaces/guest/actions/cpuburn
printf '{"value":{"name":"cpuburn","main":"dev.cpuslot.samples.CpuBurn","binary":true,"code":"%%s","env":%[8]s}}' "$(base64 -w0 %[3]s)" > %[1]s/ow-init.json
systemd-run --unit=%[4]s -p DefaultDependencies=no -p StandardOutput=append:%[5]s/openwhisk-api.log -p StandardError=append:%[5]s/openwhisk-api.log \
	/usr/bin/python3 -m http.server --bind %[6]s --directory %[1]s %[7]d
`, javaDir, record, samplesJar(t, f.n.RepoDir()), owAPIUnit, logDir, vm.GuestIP, owAPIPort, coldStartEnv()))

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
	t.Logf("both pods Ready %v after kubectl apply (emulated node)", time.Since(t1).Round(time.Second))

	// Served by shape, in the function container's scope: the action pod
	// with the agent's default pre-warm set, the revision pod with its
	// annotation's two 250m slots; none in queue-proxy's scope.
	for _, c := range []struct{ pod, container string }{{owPod, "user-action"}, {knPod, "user-container"}} {
		scope, uid := namedContainerScope(t, ctx, f.n, c.pod, c.container)
		slots := f.waitSlots(t, ctx, uid, scope, 1)
		threaded := 0
		for _, v := range slots {
			if strings.HasSuffix(v, " threaded") {
				threaded++
			}
		}
		if threaded != len(slots) {
			t.Errorf("%s: slots %v, want all threaded", c.pod, slots)
		}
		if typ := guest(t, ctx, f.n, "cat "+scope+"/cgroup.type"); typ != "domain threaded" {
			t.Errorf("%s/%s: scope cgroup.type %q, want domain threaded", c.pod, c.container, typ)
		}
		t.Logf("%s served in its %s container's scope %s: %d slots", c.pod, c.container, path.Base(scope), len(slots))
	}
	if qp, _ := namedContainerScope(t, ctx, f.n, knPod, "queue-proxy"); guest(t, ctx, f.n, "ls -d "+qp+"/cpuslot-* 2>/dev/null | wc -l") != "0" {
		t.Errorf("the Knative pod's queue-proxy container got slots")
	}

	// Both served through the agent's NRI plugin at their container's
	// start, before its first instruction (not later by the pod watch).
	f.wantServedAtStart(t, ctx, "default/"+owPod+"/user-action", "default/"+knPod+"/user-container")

	// The Knative-shaped pod's invocations run in slots, its first one
	// too: the socket was there before its probe started.
	kn := "http://" + podIPOf(t, ctx, f.n, knPod) + ":8080/invoke"
	if out, code, err := f.n.Exec(ctx, fmt.Sprintf(`slot=$(curl -sS -m 30 -o /dev/null -w '%%header{x-cpuslot-slot}' %s)
[ -n "$slot" ] && [ "$slot" != none ] || { echo "the first answer: slot=$slot"; exit 1; }
n=0; for i in $(seq 20); do s=$(curl -sS -m 30 -o /dev/null -w '%%header{x-cpuslot-slot}' %[1]s); [ -n "$s" ] && [ "$s" != none ] && n=$((n+1)); done; echo $n`, kn)); err != nil || code != 0 {
		logs, _ := f.n.Kubectl(ctx, "logs", knPod, "-c", "user-container", "--tail=20")
		t.Fatalf("the Knative-shaped pod's first invocation ran without a slot: %v %s\n--- its log:\n%s", err, out, logs)
	} else if n, _ := strconv.Atoi(strings.TrimSpace(out)); n < 18 {
		t.Errorf("%d of 20 invocations of the Knative-shaped pod ran in a slot, want 18 (90 %%)", n)
	} else {
		t.Logf("Knative-shaped pod: %d of 20 invocations in a slot", n)
	}

	// The Java runtime: Ready is its container started; wait until the
	// JVM answers at all.
	ow := "http://" + podIPOf(t, ctx, f.n, owPod) + ":8080"
	t2 := time.Now()
	if out, code, err := f.n.Exec(ctx, fmt.Sprintf(`for i in $(seq 600); do curl -s -o /dev/null -m 10 %s/ && exit 0; sleep 1; done; exit 1`, ow)); err != nil || code != 0 {
		logs, _ := f.n.Kubectl(ctx, "logs", owPod, "--tail=20")
		t.Fatalf("the Java runtime does not answer HTTP: %v %s\n--- its log:\n%s", err, out, logs)
	}
	t.Logf("the Java runtime answers HTTP %v after its pod was Ready (JVM start, emulated node)", time.Since(t2).Round(time.Second))

	deadline := strconv.FormatInt(time.Now().Add(2*time.Hour).UnixMilli(), 10)
	owRun := func(id string, ms int) guestReq {
		return guestReq{url: ow + "/run", body: fmt.Sprintf(`{"value":{"ms":%d,"threads":1},"namespace":"guest","action_name":"/guest/cpuburn","action_version":"0.0.1","activation_id":"%s","transaction_id":"t%s","deadline":"%s","api_key":"%s"}`,
			ms, id, id, deadline, owAPIKey)}
	}
	// /init once, as the invoker sends it (a second is refused), then
	// the cold start's /run right after its answer, then four at once.
	if a := guestPosts(t, ctx, f.n, []guestReq{{url: ow + "/init", file: javaDir + "/ow-init.json"}})[0]; a.status != 200 {
		t.Fatalf("/init: %d %s", a.status, a.body)
	}
	if a := guestPosts(t, ctx, f.n, []guestReq{{url: ow + "/init", file: javaDir + "/ow-init.json"}})[0]; a.status == 200 {
		t.Errorf("a second /init succeeded: %s", a.body)
	}
	// The cold start's first /run runs at the annotation's quota, in a
	// slot: /init answered once the runtime had read the annotation it
	// started reading with the init's __OW_* fields.
	if a := guestPosts(t, ctx, f.n, []guestReq{owRun("ow0", 1)})[0]; a.status != 200 {
		t.Fatalf("/run: %d %s", a.status, a.body)
	} else if q, src := a.headers.Get("X-Cpuslot-Quota-Milli"), a.headers.Get("X-Cpuslot-Quota-Source"); q != "250" || src != "annotation" || a.headers.Get("X-Cpuslot-Slot") == "" {
		logs, _ := f.n.Kubectl(ctx, "logs", owPod, "--tail=20")
		t.Errorf("the cold start's first /run ran at quota %q from %q in slot %q (X-Cpuslot-Noslot %q), want 250 from the annotation in a slot\n%s\n--- stand-in API log:\n%s",
			q, src, a.headers.Get("X-Cpuslot-Slot"), a.headers.Get("X-Cpuslot-Noslot"), logs, guest(t, ctx, f.n, "tail -n 5 "+logDir+"/openwhisk-api.log; true"))
	} else {
		t.Logf("the cold start's first /run: quota %sm from the annotation, slot %s", q, a.headers.Get("X-Cpuslot-Slot"))
	}
	var reqs []guestReq
	for i := 0; i < 4; i++ {
		reqs = append(reqs, owRun(fmt.Sprintf("owc%d", i), 200))
	}
	var got []string
	for i, a := range guestPosts(t, ctx, f.n, reqs) {
		if a.status != 200 {
			t.Fatalf("concurrent /run %d: %d %s", i, a.status, a.body)
		}
		if q, src := a.headers.Get("X-Cpuslot-Quota-Milli"), a.headers.Get("X-Cpuslot-Quota-Source"); q != "250" || src != "annotation" {
			t.Errorf("/run %d ran at quota %q from %q, want 250 from the annotation", i, q, src)
		}
		if a.headers.Get("X-Cpuslot-Slot") == "" {
			t.Errorf("/run %d ran without a slot (X-Cpuslot-Noslot %q)", i, a.headers.Get("X-Cpuslot-Noslot"))
		}
		got = append(got, a.headers.Get("X-Cpuslot-Slot")+"/"+a.headers.Get("X-Cpuslot-Outcome")+a.headers.Get("X-Cpuslot-Noslot"))
	}
	t.Logf("4 /run sent at once: slot/outcome %v", got)

	// A CPU-bound invocation alone at 250m: 25 % +/- 2.5 points. The cap
	// is checked every time; the lower bound only when the slot was
	// throttled for at least half the wall time (else the emulated node
	// did not give it the CPU: measured again, three times at most).
	for try := 1; ; try++ {
		a := guestPosts(t, ctx, f.n, []guestReq{owRun(fmt.Sprintf("owburn%d", try), 3000)})[0]
		if a.status != 200 {
			t.Fatalf("CPU-bound /run: %d %s", a.status, a.body)
		}
		share, wall, err := cpuShare(a)
		if err != nil {
			t.Fatal(err)
		}
		ns, _ := strconv.ParseInt(a.headers.Get("X-Cpuslot-Throttled-Ns"), 10, 64)
		throttled := time.Duration(ns)
		t.Logf("CPU-bound invocation at 250m: %.1f%% of a CPU, throttled %.0f%% of its wall time", 100*share, 100*float64(throttled)/float64(wall))
		if share > 0.275 {
			t.Errorf("%.1f%% of a CPU at 250m: above the cap", 100*share)
			break
		}
		if share >= 0.225 {
			break
		}
		if throttled >= wall/2 {
			t.Errorf("%.1f%% of a CPU at 250m while throttled for %.0f%% of the time: below the quota", 100*share, 100*float64(throttled)/float64(wall))
			break
		}
		if try == 3 {
			t.Logf("LOWER BOUND NOT CHECKED: the node did not let the slot reach its quota in 3 tries")
			break
		}
	}
	if logs, _ := f.n.Kubectl(ctx, "logs", owPod, "--tail=50"); !strings.Contains(logs, "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX") {
		t.Errorf("no activation sentinel in the action's log:\n%s", logs)
	}

	// A light load for PrometheusQueries: one /run every half second, from
	// a guest unit endJava stops.
	guest(t, ctx, f.n, fmt.Sprintf(`set -e
printf '%%s' '%[1]s' > %[2]s/ow-load.json
systemd-run --unit=%[3]s -p DefaultDependencies=no -p StandardOutput=null -p StandardError=null /bin/bash -c '
while true; do
	curl -s -m 30 -o /dev/null -H "Content-Type: application/json" --data-binary @%[2]s/ow-load.json %[4]s/run
	sleep 0.5
done'`, owRun("owload", 5).body, javaDir, javaLoad, ow))
	t.Logf("step took %v", time.Since(t0).Round(time.Second))
}

// endJava stops the load and the OpenWhisk API stand-in and deletes the
// Java runtime pods: their slots go with them.
func (f *served) endJava(t *testing.T) {
	if !f.java {
		return
	}
	f.java = false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 10*time.Minute)
	defer cancel()
	if out, err := f.n.MustExec(ctx, fmt.Sprintf("for u in %s %s %s; do systemctl stop $u; systemctl reset-failed $u; done 2>/dev/null; rm -rf %s; true", javaLoad, owAPIUnit, importUnit, javaDir)); err != nil {
		t.Errorf("stopping the Java load: %v: %s", err, out)
	}
	uid, _ := f.n.Kubectl(ctx, "get", "pod", owPod, "-o", "jsonpath={.metadata.uid}")
	t0 := time.Now()
	// Generous: on the loaded emulated node the kubelet has taken minutes
	// to finish a pod (the slice goes at its housekeeping).
	if _, err := f.n.Kubectl(ctx, "delete", "pod", owPod, knPod, "--ignore-not-found", "--wait=true", "--timeout=8m"); err != nil {
		desc, _ := f.n.Kubectl(ctx, "describe", "pod", owPod)
		logs, _ := f.n.Kubectl(ctx, "-n", f.ns, "logs", "-l", "app.kubernetes.io/name=cpuslot", "--tail=40")
		left, _, _ := f.n.Exec(ctx, fmt.Sprintf("find %s 2>&1 | head -n 40; journalctl -u kubelet.service -n 0 >/dev/null 2>&1; tail -n 30 %s/kubelet.log", podSlicePath(uid, "Burstable"), logDir))
		t.Errorf("deleting the Java runtime pods: %v\n--- %s:\n%s\n--- agent:\n%s\n--- the pod's slice and the kubelet's log:\n%s", err, owPod, desc, logs, left)
	} else {
		t.Logf("the Java runtime pods deleted in %v", time.Since(t0).Round(time.Second))
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
	jar, err := cluster.SamplesJar(repo)
	if err != nil {
		t.Fatal(err)
	}
	return jar
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
		// X-Cpuslot-Usage: the invocation's CPU in the answer (X-Cpuslot-Cpu-Ns)
		fmt.Fprintf(&script, "curl -sS -m 300 -D $d/h%d -o $d/b%d -H 'Content-Type: application/json' -H 'X-Cpuslot-Usage: reply'", i, i)
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
// the runtime reports over the function's own wall time (also returned).
func cpuShare(a guestAnswer) (float64, time.Duration, error) {
	return cluster.ActivationShare(a.headers, a.body)
}
