package kubernetes

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	goruntime "runtime"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// preparedSink records what a source asked to serve (pure logic: no cgroups).
type preparedSink struct {
	mu       sync.Mutex
	prepared map[string]bool
}

func (s *preparedSink) Prepare(c discover.Container) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prepared[c.Name] = true
	return nil
}
func (s *preparedSink) Forget(string)         {}
func (s *preparedSink) Resize(string, uint32) {}

// Run returns (and the agent reports ready) only after every runtime pod
// already on the node was examined: the informer's store can be synced
// before its event handler has been told of each pod, so waiting on the
// store alone left pods unserved at ready (TestReconcile failed so in the
// cgroup v2 VM on a loaded machine: "served []").
func TestRunServesThePodsPresentBeforeReady(t *testing.T) {
	const pods = 300
	var objs []runtime.Object
	for i := range pods {
		objs = append(objs, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("wsk-%d", i), Namespace: "openwhisk", UID: types.UID(fmt.Sprintf("uid-%d", i)),
				Labels: map[string]string{"user-action-pod": "true"}},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "user-action"}},
				Volumes: []corev1.Volume{{Name: "cpuslot", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
				Name: "user-action", ContainerID: fmt.Sprintf("containerd://c%d", i), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
		})
	}
	// The race shows more often at some processor counts than others.
	defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(0))
	for round := range 30 {
		goruntime.GOMAXPROCS([]int{1, 2, 4}[round%3])
		cs := fake.NewSimpleClientset(objs...)
		src := New(Config{NodeName: "n1", PodsDir: t.TempDir(), SocketVolume: "cpuslot", Selector: Selector{OpenWhisk: true},
			Pool: settings.Default(), Ceilings: settings.DefaultCeilings()}, cs, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		src.cgroupOf = func(_ context.Context, id string) (string, error) { return "/kubepods/" + id, nil }
		sink := &preparedSink{prepared: map[string]bool{}}
		ctx, cancel := context.WithCancel(context.Background())
		if err := src.Run(ctx, sink); err != nil {
			t.Fatal(err)
		}
		sink.mu.Lock()
		n := len(sink.prepared)
		sink.mu.Unlock()
		cancel()
		if n != pods {
			t.Fatalf("round %d: Run returned with %d of %d present pods served", round, n, pods)
		}
	}
}
