package kubernetes

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// hangingSink's Prepare does not return until released: a pool whose
// cgroup writes hang.
type hangingSink struct {
	entered chan struct{}
	release chan struct{}
}

func (s hangingSink) Prepare(discover.Container) error {
	s.entered <- struct{}{}
	<-s.release
	return nil
}
func (hangingSink) Forget(string)         {}
func (hangingSink) Resize(string, uint32) {}

// TestWorkerStalled: the worker that serves the pods the informer reports
// is a stall /healthz names while one pod's serving does not end; waiting
// for pods is not.
func TestWorkerStalled(t *testing.T) {
	cs := fake.NewSimpleClientset()
	src := New(Config{NodeName: "n1", PodsDir: t.TempDir(), SocketVolume: "cpuslot",
		Selector: Selector{Annotated: true}, Ceilings: settings.DefaultCeilings(), Resync: time.Hour}, cs, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	src.cgroupOf = func(context.Context, string) (string, error) { return "/pods/x", nil }
	sink := hangingSink{entered: make(chan struct{}, 1), release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(sink.release) }) }
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	t.Cleanup(release)
	if err := src.Run(ctx, sink); err != nil {
		t.Fatal(err)
	}
	stalled := func() error { return src.Stalled(time.Now().Add(time.Hour), time.Minute) }
	if err := stalled(); err != nil {
		t.Fatalf("waiting for pods: %v", err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "fn", Namespace: "default", UID: "uid-1", Annotations: map[string]string{"cpuslot.dev/enabled": "true"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "fn"}},
			Volumes: []corev1.Volume{{Name: "cpuslot", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "fn", ContainerID: "containerd://c1", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sink.entered:
	case <-time.After(time.Minute): // a bound for a hang, not a timing claim
		t.Fatal("the pod was not served within a minute")
	}
	err := stalled()
	if err == nil || !strings.Contains(err.Error(), "pod informer worker stalled") {
		t.Errorf("Stalled says %v while serving a pod hangs, want the worker named", err)
	}
	release()
	waitUntil(t, "the worker going again", func() bool { return stalled() == nil })
}
