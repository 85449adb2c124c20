package v2node

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// servedDeployment is a one-replica Deployment of served pods (probe
// slots: one thread invoking through the agent), as runtimes are deployed.
func servedDeployment(name, prewarm string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: %[1]s
  namespace: default
spec:
  replicas: 1
  selector:
    matchLabels: {app: %[1]s}
  template:
    metadata:
      labels: {app: %[1]s}
      annotations:
        cpuslot.dev/enabled: "true"
        cpuslot.dev/prewarm: "%[2]s"
    spec:
      terminationGracePeriodSeconds: 1
      volumes:
      - name: cpuslot
        emptyDir: {}
      containers:
      - name: fn
        image: %[3]s
        imagePullPolicy: Never
        args: ["slots", "-threads", "1", "-burn", "2ms", "-pause", "20ms"]
        env:
        - name: CPUSLOT_SOCKET
          value: /run/cpuslot/agent.sock
        volumeMounts:
        - name: cpuslot
          mountPath: /run/cpuslot
        resources:
          requests: {cpu: 250m, memory: 32Mi}
          limits: {cpu: 500m, memory: 64Mi}
`, name, prewarm, cluster.ProbeImage)
}

// poolUse is one of the agent's pools: its name, budget and what it has
// granted (/debug/pools).
type poolUse struct {
	Name        string `json:"name"`
	BudgetMilli uint32 `json:"budgetMilli"`
	UsedMilli   uint32 `json:"usedMilli"`
}

// debugPools reads the agent's pools (/debug/pools, through the API
// server's proxy to the agent pod).
func (f *served) debugPools(t *testing.T, ctx context.Context) []poolUse {
	t.Helper()
	agent := f.agentPod(t, ctx)
	out, err := f.n.Kubectl(ctx, "get", "--raw", "/api/v1/namespaces/"+f.ns+"/pods/"+agent+":9464/proxy/debug/pools")
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Pools []poolUse `json:"pools"`
	}
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("/debug/pools: %v: %s", err, out)
	}
	return p.Pools
}

// pools lists the names of the agent's pools, sorted.
func (f *served) pools(t *testing.T, ctx context.Context) []string {
	t.Helper()
	var names []string
	for _, x := range f.debugPools(t, ctx) {
		names = append(names, x.Name)
	}
	sort.Strings(names)
	return names
}

func (f *served) agentPod(t *testing.T, ctx context.Context) string {
	t.Helper()
	agent, err := f.n.Kubectl(ctx, "-n", f.ns, "get", "pods", "-l", "app.kubernetes.io/name=cpuslot", "-o", "jsonpath={.items[0].metadata.name}")
	if err != nil || agent == "" {
		t.Fatalf("agent pod: %v %q", err, agent)
	}
	return agent
}

// runningPod waits (at most 5 minutes) for the one Ready pod of
// Deployment app and returns its name.
func (f *served) runningPod(t *testing.T, ctx context.Context, app string) string {
	t.Helper()
	start := time.Now()
	for {
		out, _ := f.n.Kubectl(ctx, "get", "pods", "-l", "app="+app, "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if fs := strings.Fields(line); len(fs) == 2 && fs[1] == "True" {
				return fs[0]
			}
		}
		if time.Since(start) > 5*time.Minute {
			desc, _ := f.n.Kubectl(ctx, "describe", "pods", "-l", "app="+app)
			t.Fatalf("no Ready pod of %s after 5 min: %q\n%s", app, out, desc)
		}
		time.Sleep(time.Second)
	}
}

// drain: `kubectl drain` as an operator runs it (DaemonSets stay, emptyDir
// data goes). The served pod of a Deployment is evicted: its pod slice and
// every slot go, the agent drops its pool, the agent pod itself keeps
// running; the replacement stays Pending while the node is cordoned.
// Uncordoned, the replacement runs and is served, invoking in slots.
//
// fn, a bare pod, is deleted first: drain refuses pods no controller
// would recreate. The served pod the later steps use becomes the
// Deployment's.
func (f *served) drain(t *testing.T) {
	ctx := f.ctx(t, 12*time.Minute)
	const app = "svc"
	if _, err := f.n.Kubectl(ctx, "apply", "-f", writeManifest(t, servedDeployment(app, "250m=2"))); err != nil {
		t.Fatal(err)
	}
	pod := f.runningPod(t, ctx, app)
	scope, uid, _ := containerScope(t, ctx, f.n, "default", pod)
	f.waitSlots(t, ctx, uid, scope, 2)
	if _, err := f.n.Kubectl(ctx, "delete", "pod", f.pod, "--wait=true", "--timeout=4m"); err != nil {
		t.Fatal(err)
	}
	agent := f.agentPod(t, ctx)

	t0 := time.Now()
	out, err := f.n.Kubectl(ctx, "drain", NodeName, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=5m")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	tDrained := time.Since(t0)
	uncordoned := false
	defer func() {
		if !uncordoned {
			f.n.Kubectl(context.WithoutCancel(ctx), "uncordon", NodeName)
		}
	}()
	t.Logf("kubectl drain took %v:\n%s", tDrained.Round(time.Millisecond), strings.TrimSpace(out))
	// The evicted pod's slice goes (the kubelet), and no slot is left
	// anywhere; the agent pod was not evicted.
	podSlice := scope[:strings.LastIndex(scope, "/")]
	if out, code, err := f.n.Exec(ctx, fmt.Sprintf(`for i in $(seq 120); do
	[ ! -e %[1]s ] && [ -z "$(find /sys/fs/cgroup/kubepods.slice -type d -name 'cpuslot-*' -print -quit)" ] && exit 0
	sleep 1
done
ls -d %[1]s; find /sys/fs/cgroup/kubepods.slice -type d -name 'cpuslot-*'; exit 1`, podSlice)); err != nil || code != 0 {
		t.Errorf("120 s after the drain: the evicted pod's slice or slots are left: %v\n%s", err, out)
	} else {
		t.Logf("drained: the evicted pod's slice and every slot gone %v after the drain began", time.Since(t0).Round(time.Millisecond))
	}
	var pools []string
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(time.Second) {
		if pools = f.pools(t, ctx); len(pools) == 0 {
			break
		}
	}
	if len(pools) != 0 {
		t.Errorf("the agent still has pools after the drain: %v", pools)
	}
	if now := f.agentPod(t, ctx); now != agent {
		t.Errorf("the agent pod changed across the drain: %s -> %s (a DaemonSet pod is not evicted)", agent, now)
	}
	if out, err := f.n.Kubectl(ctx, "-n", f.ns, "get", "pod", agent, "-o", "jsonpath={.status.phase} {.metadata.deletionTimestamp}"); err != nil || strings.TrimSpace(out) != "Running" {
		t.Errorf("agent pod after the drain: %q %v", out, err)
	}
	if out, _ := f.n.Kubectl(ctx, "get", "pods", "-l", "app="+app, "-o", "jsonpath={range .items[*]}{.status.phase} {end}"); strings.TrimSpace(out) != "Pending" {
		t.Errorf("the replacement of the evicted pod while cordoned: %q, want one Pending", out)
	}

	t1 := time.Now()
	uncordoned = true
	if _, err := f.n.Kubectl(ctx, "uncordon", NodeName); err != nil {
		t.Fatal(err)
	}
	pod = f.runningPod(t, ctx, app)
	tReady := time.Since(t1)
	scope, uid, id := containerScope(t, ctx, f.n, "default", pod)
	slots := f.waitSlots(t, ctx, uid, scope, 2)
	t.Logf("uncordoned: %s Ready %v, served %v after the uncordon: %v", pod, tReady.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond), slots)
	if len(slots) != 2 {
		t.Errorf("the new pod's slots: %v, want the 2 pre-warmed", slots)
	}
	f.pod, f.scope, f.id = pod, scope, id
	var st loadStats
	for start := time.Now(); time.Since(start) < 2*time.Minute; time.Sleep(2 * time.Second) {
		if st = f.stats(t, ctx); st.OK >= 20 {
			break
		}
	}
	t.Logf("the new pod: %d invocations in a slot, %d without, %d failed", st.OK, st.Unslotted, st.Failed)
	if st.OK < 20 || st.Failed > 0 {
		t.Errorf("the new pod's invocations: %d in a slot (want >= 20), %d failed: %v", st.OK, st.Failed, st.Errors)
	}
}
