package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// firstSlotPod is a served pod whose probe measures, from its first
// instruction, how long until its first slot is granted (probe firstslot).
// cpuslot.dev/container names the container, so NRI selects it too (an
// annotated pod's first container only the pod watch can name).
func firstSlotPod(name string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
  annotations:
    cpuslot.dev/enabled: "true"
    cpuslot.dev/container: fn
    cpuslot.dev/prewarm: "250m=1"
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: fn
    image: %s
    imagePullPolicy: Never
    args: ["firstslot", "-quota", "250m"]
    env:
    - {name: CPUSLOT_SOCKET, value: /run/cpuslot/agent.sock}
    resources:
      limits: {cpu: 500m, memory: 64Mi}
      requests: {cpu: 100m, memory: 32Mi}
    volumeMounts:
    - {name: cpuslot, mountPath: /run/cpuslot}
  volumes:
  - name: cpuslot
    emptyDir: {}
`, name, cluster.ProbeImage)
}

var firstSlotLine = regexp.MustCompile(`first-slot-us=(\d+) tries=(\d+)`)

// TestFirstSlotNRIvsWatch: time from a container's start to its first slot
// ready, with the agent as an NRI plugin (nri.enabled=true) and with the
// pod watch alone (nri.enabled=false), in alternating blocks on one
// cluster. Through NRI every container's first connection attempt finds
// its socket and gets a slot (the pool is made before its first
// instruction); through the pod watch the container waits for the agent.
// The times are logged, not bounded (a loaded machine);
// CPUSLOT_E2E_FIRSTSLOT_PODS=N starts N pods per block (default 5).
func TestFirstSlotNRIvsWatch(t *testing.T) {
	c := cluster.Need(t, kc)
	perBlock := 5
	if v := os.Getenv("CPUSLOT_E2E_FIRSTSLOT_PODS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 50 {
			t.Fatalf("CPUSLOT_E2E_FIRSTSLOT_PODS=%q: want 1..50", v)
		}
		perBlock = n
	}
	const ns, release = "cpuslot-system", "cpuslot"
	installChart(t, c, release, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	times := map[bool][]time.Duration{} // NRI on -> first slot after start
	k := 0
	for block, nri := range []bool{true, false, true, false} {
		if block > 0 {
			if out, err := helm(ctx, t, c, "upgrade", release, chartDir(t), "-n", ns, "--reuse-values",
				"--set", fmt.Sprintf("nri.enabled=%v", nri), "--wait", "--timeout", "120s"); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if out, err := c.Kubectl(ctx, "-n", ns, "rollout", "status", "daemonset/"+release, "--timeout=120s"); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
		}
		if nri {
			// The plugin connects in the background once the agent runs.
			if err := pollFor(ctx, 60*time.Second, func() (bool, string) {
				logs, _ := c.Kubectl(ctx, "-n", ns, "logs", "-l", "app.kubernetes.io/name=cpuslot", "--tail=-1")
				return strings.Contains(logs, "connected to the runtime as an NRI plugin"), "the agent did not connect to containerd's NRI socket"
			}); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < perBlock; i++ {
			k++
			name := fmt.Sprintf("firstslot-%d", k)
			if _, err := c.Apply(ctx, firstSlotPod(name)); err != nil {
				t.Fatal(err)
			}
			var line string
			if err := pollFor(ctx, 3*time.Minute, func() (bool, string) {
				logs, _ := c.Kubectl(ctx, "logs", name)
				line = lastLine(grepLines(logs, "first-slot-us="))
				if line == "" {
					line = lastLine(grepLines(logs, "no slot"))
				}
				return line != "", "pod " + name + " logged no first slot; its log: " + lastLine(logs)
			}); err != nil {
				t.Fatal(err)
			}
			c.Kubectl(ctx, "delete", "pod", name, "--wait=false")
			m := firstSlotLine.FindStringSubmatch(line)
			if m == nil {
				t.Errorf("%s (nri.enabled=%v): %s", name, nri, line)
				continue
			}
			us, _ := strconv.ParseInt(m[1], 10, 64)
			tries, _ := strconv.Atoi(m[2])
			d := time.Duration(us) * time.Microsecond
			times[nri] = append(times[nri], d)
			t.Logf("%s nri.enabled=%v: first slot %v after the container's start, %d connection attempts", name, nri, d.Round(10*time.Microsecond), tries)
			if nri && tries != 1 {
				// Only a start the plugin let go on without its pool
				// (nri.startTimeout passed: fail-open, logged) may.
				logs, _ := c.Kubectl(ctx, "-n", ns, "logs", "-l", "app.kubernetes.io/name=cpuslot", "--tail=-1")
				if l := lastLine(grepLines(grepLines(logs, "default/"+name+"/"), "nri.startTimeout")); l != "" {
					t.Logf("%s: NRI failed open (the node was slower than nri.startTimeout): %s", name, l)
				} else {
					t.Errorf("%s: through NRI its first connection attempt found no slot (%d attempts)", name, tries)
				}
			}
		}
	}
	pct := func(d []time.Duration) string {
		return fmt.Sprintf("p50 %v, p90 %v, max %v", cluster.Percentile(d, 0.5).Round(10*time.Microsecond),
			cluster.Percentile(d, 0.9).Round(10*time.Microsecond), cluster.Percentile(d, 1).Round(10*time.Microsecond))
	}
	on, off := times[true], times[false]
	if len(on) > 0 && len(off) > 0 {
		t.Logf("container start -> first slot ready, %d pods each: NRI %s; pod watch %s; ratio of medians (pod watch / NRI) %.0fx",
			len(on), pct(on), pct(off), float64(cluster.Percentile(off, 0.5))/float64(cluster.Percentile(on, 0.5)))
	}
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
