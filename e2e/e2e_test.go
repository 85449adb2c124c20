// Package e2e runs cpuslot on a real single-node Kubernetes (e2e/cluster)
// brought up once for the package by TestMain and taken down at the end,
// also on failure or interrupt.
//
// Gated: the tests skip unless CPUSLOT_E2E=1; with CPUSLOT_E2E=1 a missing
// dependency fails the run. `make e2e` prepares everything and runs them.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

var kc *cluster.Cluster

func TestMain(m *testing.M) {
	var opts cluster.Options
	if cluster.Enabled() {
		// make images' tarballs and Knative Serving's (hack/knative.sh).
		imgs, err := e2eImages()
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			os.Exit(1)
		}
		opts.Images = imgs
	}
	os.Exit(cluster.Main(m, opts, &kc))
}

// namespace creates a namespace for one test, waits until pods can be
// created in it, and deletes it when the test ends.
func namespace(t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Kubectl(ctx, "create", "namespace", name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := c.Kubectl(ctx, "delete", "namespace", name, "--wait=true", "--timeout=90s"); err != nil {
			t.Errorf("deleting namespace %s: %v: %s", name, err, out)
		}
	})
	if err := c.WaitNamespace(ctx, name, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

const smokeManifest = `
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: probe-ds
  namespace: e2e-smoke
spec:
  selector:
    matchLabels: {app: probe-ds}
  template:
    metadata:
      labels: {app: probe-ds}
    spec:
      hostPID: true
      terminationGracePeriodSeconds: 2
      containers:
      - name: probe
        image: %[1]s
        imagePullPolicy: Never
        args: ["serve", "-addr", ":8080"]
        securityContext:
          privileged: true
        env:
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        readinessProbe:
          httpGet: {path: /healthz, port: 8080}
          periodSeconds: 1
        volumeMounts:
        - {name: cgroup, mountPath: /sys/fs/cgroup, readOnly: true}
      volumes:
      - name: cgroup
        hostPath: {path: /sys/fs/cgroup}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: probe-deploy
  namespace: e2e-smoke
spec:
  replicas: 2
  selector:
    matchLabels: {app: probe-deploy}
  template:
    metadata:
      labels: {app: probe-deploy}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: probe
        image: %[1]s
        imagePullPolicy: Never
        args: ["apiserver", "-addr", ":8080"]
        env:
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        readinessProbe:
          httpGet: {path: /healthz, port: 8080}
          periodSeconds: 1
        resources:
          requests: {cpu: 100m, memory: 32Mi}
          limits: {cpu: 500m, memory: 64Mi}
`

// TestSmoke: a privileged hostPID DaemonSet and a Deployment on locally
// imported images become Ready; logs and exec work; a pod reaches the API
// server through the kubernetes service with its service account; the
// containers' cgroups are where cpuslot looks for them.
func TestSmoke(t *testing.T) {
	c := cluster.Need(t, kc)
	namespace(t, c, "e2e-smoke")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t0 := time.Now()
	if out, err := c.Apply(ctx, fmt.Sprintf(smokeManifest, cluster.ProbeImage)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	tApply := time.Since(t0)
	ready := map[string]time.Duration{}
	for _, w := range []string{"daemonset/probe-ds", "deployment/probe-deploy"} {
		if out, err := c.Kubectl(ctx, "-n", "e2e-smoke", "rollout", "status", w, "--timeout=120s"); err != nil {
			pods, _ := c.Kubectl(ctx, "-n", "e2e-smoke", "describe", "pods")
			t.Fatalf("%s not Ready: %v\n%s\n%s", w, err, out, pods)
		}
		ready[w] = time.Since(t0)
	}
	t.Logf("time to Ready after kubectl apply (which took %v): DaemonSet %v, Deployment (2 replicas) %v",
		tApply.Round(time.Millisecond), ready["daemonset/probe-ds"].Round(time.Millisecond), ready["deployment/probe-deploy"].Round(time.Millisecond))

	// Logs: the DaemonSet's pod sees the host's PID 1 (hostPID); the
	// Deployment's pods reached the API server in-cluster.
	out, err := c.Kubectl(ctx, "-n", "e2e-smoke", "logs", "daemonset/probe-ds")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "probe: started") {
		t.Fatalf("kubectl logs of the DaemonSet: no start line:\n%s", out)
	}
	if strings.Contains(out, `"pid1":"/pause"`) {
		t.Errorf("DaemonSet pod with hostPID sees the sandbox as PID 1:\n%s", out)
	}
	var apiOK bool
	for i := 0; i < 50 && !apiOK; i++ {
		out, err = c.Kubectl(ctx, "-n", "e2e-smoke", "logs", "-l", "app=probe-deploy", "--prefix")
		if err != nil {
			t.Fatal(err)
		}
		apiOK = strings.Count(out, `"gitVersion": "`+cluster.KubernetesVersion+`"`) == 2
		if !apiOK {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !apiOK {
		t.Errorf("the Deployment's pods did not both reach the API server through the kubernetes service:\n%s", out)
	}

	// Exec into the privileged pod.
	out, err = c.Kubectl(ctx, "-n", "e2e-smoke", "exec", "daemonset/probe-ds", "--", "/probe", "info")
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		PID1   string `json:"pid1"`
		Node   string `json:"node"`
		Cgroup string `json:"cgroup"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("kubectl exec: %v: %q", err, out)
	}
	if info.Node != c.NodeName() {
		t.Errorf("exec: NODE_NAME %q, want %q", info.Node, c.NodeName())
	}
	t.Logf("exec in the DaemonSet pod: host PID 1 is %q", info.PID1)

	// The Deployment's containers' cgroups (cgroupfs driver): where the
	// agent will put slots.
	podsJSON, err := c.Kubectl(ctx, "-n", "e2e-smoke", "get", "pods", "-l", "app=probe-deploy", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var pods struct {
		Items []struct {
			Metadata struct {
				UID string `json:"uid"`
			} `json:"metadata"`
			Status struct {
				QOSClass          string `json:"qosClass"`
				ContainerStatuses []struct {
					ContainerID string `json:"containerID"`
				} `json:"containerStatuses"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(podsJSON), &pods); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if len(p.Status.ContainerStatuses) != 1 {
			t.Fatalf("pod %s: %d container statuses", p.Metadata.UID, len(p.Status.ContainerStatuses))
		}
		id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
		dir := cluster.ContainerCgroupDir("cpu", p.Status.QOSClass, p.Metadata.UID, id)
		quota, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us"))
		if err != nil {
			quota, err = os.ReadFile(filepath.Join(dir, "cpu.max"))
		}
		if err != nil {
			t.Errorf("container cgroup of pod %s: %v", p.Metadata.UID, err)
			continue
		}
		t.Logf("container cgroup %s: quota %s", dir, strings.TrimSpace(string(quota)))
	}
}
