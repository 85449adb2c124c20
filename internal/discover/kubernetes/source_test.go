package kubernetes

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
)

// TestReconcile drives the source with the client-go fake API (a unit-test
// stand-in: the e2e tests use a real API server and containerd) against a
// real agent on the real kernel's cgroups.
func TestReconcile(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	runtimePod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "wsk-action-1", Namespace: "openwhisk", UID: types.UID("uid-1"),
			Labels:      map[string]string{"user-action-pod": "true"},
			Annotations: map[string]string{ann("pool.prewarm"): "500m=2", ann("pool.mode"): "warp", ann("pool.maxSlots"): "4096"}},
		Spec: corev1.PodSpec{NodeName: "n1",
			Containers: []corev1.Container{{Name: "user-action"}},
			Volumes:    []corev1.Volume{{Name: "cpuslot", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "user-action", ContainerID: "containerd://c1", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
	noVolume := runtimePod.DeepCopy()
	noVolume.Name, noVolume.UID, noVolume.Spec.Volumes = "wsk-action-2", "uid-2", nil
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-3"},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "nginx"}}}}
	cs := fake.NewSimpleClientset(runtimePod, noVolume, plain)
	a, podsDir := runAgent(t, h, cs, Selector{OpenWhisk: true, Knative: true, Annotated: true}, "uid-1", os.Stderr,
		func(_ context.Context, id string) (string, error) {
			if id != "c1" {
				t.Errorf("asked for container %q", id)
			}
			return rel, nil
		})
	ctx := context.Background()
	waitUntil(t, "agent ready", a.Ready)

	sums := a.Summaries()
	if len(sums) != 1 || sums[0].Name != "openwhisk/wsk-action-1/user-action" {
		t.Fatalf("served %+v", sums)
	}
	if q := sums[0].Quotas; len(q) != 1 || q[0].QuotaMilli != 500 || q[0].Slots != 2 || sums[0].Mode != "affinity" {
		t.Fatalf("annotations not applied (prewarm) or bad one not ignored (mode): %+v", sums[0])
	}
	waitUntil(t, "events", func() bool {
		ev, _ := cs.CoreV1().Events("openwhisk").List(ctx, metav1.ListOptions{})
		var reasons []string
		for _, e := range ev.Items {
			reasons = append(reasons, e.Reason+":"+e.InvolvedObject.Name)
		}
		all := strings.Join(reasons, ",")
		return strings.Contains(all, ReasonServing+":wsk-action-1") && strings.Contains(all, ReasonInvalidAnnotation+":wsk-action-1") &&
			strings.Contains(all, ReasonAnnotationClamped+":wsk-action-1") &&
			strings.Contains(all, ReasonPrepareFailed+":wsk-action-2")
	})

	// A process of the container reaches the agent through the pod's socket.
	cgrouptest.JoinProcess(t, h, rel)
	c, err := client.Dial(SocketPath(podsDir, "uid-1", "cpuslot"), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	l, err := c.Acquire(500, "guest/fib", "1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Release(slotv1.InvocationOK); err != nil {
		t.Fatal(err)
	}
	runtime.UnlockOSThread()
	c.Close()

	// Deleting the pod tears its pool down: socket and slots gone.
	if err := cs.CoreV1().Pods("openwhisk").Delete(ctx, "wsk-action-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "pool torn down", func() bool { return len(a.Summaries()) == 0 })
	if _, err := os.Stat(SocketPath(podsDir, "uid-1", "cpuslot")); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
	// The pool leaves the agent's list before its slots are removed.
	waitUntil(t, "the pod's slots to be removed", func() bool { return len(cgrouptest.Leftovers(h, rel)) == 0 })
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	// A bound for a hang, not a timing claim: a loaded machine is slow.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
