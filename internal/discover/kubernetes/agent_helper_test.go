package kubernetes

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// selectedPod is a running pod on node n1, annotated to be served with
// prewarm, with one container "fn" (containerd id c1) and the cpuslot
// volume.
func selectedPod(uid, prewarm string, res corev1.ResourceRequirements) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "fn", Namespace: "default", UID: k8stypes.UID(uid),
			Annotations: map[string]string{AnnEnabled: "true", ann("pool.prewarm"): prewarm}},
		Spec: corev1.PodSpec{NodeName: "n1",
			Containers: []corev1.Container{{Name: "fn", Resources: res}},
			Volumes:    []corev1.Volume{{Name: "cpuslot", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "fn", ContainerID: "containerd://c1", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
}

// runAgent runs a real agent (no socket or HTTP of its own, maintenance
// hourly: only the API makes it act) with a Source over cs selecting pods
// by sel and finding container cgroups with cgroupOf, until the test ends.
// The agent logs warnings to log; pod uid's socket directory is made. It
// returns the agent and the pods directory.
func runAgent(t *testing.T, h *cgroup.Hierarchy, cs kubernetes.Interface, sel Selector, uid string, log io.Writer,
	cgroupOf func(context.Context, string) (string, error)) (*agent.Agent, string) {
	t.Helper()
	podsDir := t.TempDir()
	os.Chmod(podsDir, 0o755)
	os.MkdirAll(filepath.Dir(SocketPath(podsDir, uid, "cpuslot")), 0o777)
	cfg := agent.DefaultConfig()
	cfg.Socket, cfg.HTTP = "", ""
	cfg.ReapInterval = agent.Duration{Duration: time.Hour}
	logger := slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, err := agent.New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	pc, _ := cfg.Settings()
	src := New(Config{NodeName: "n1", PodsDir: podsDir, SocketVolume: "cpuslot",
		Selector: sel, Pool: pc, Ceilings: settings.DefaultCeilings(), Resync: time.Hour}, cs, h, logger)
	src.cgroupOf = cgroupOf
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, []discover.Source{src}, true) }()
	t.Cleanup(func() { cancel(); <-done })
	return a, podsDir
}

// syncWriter lets a test read what the agent's logger wrote.
type syncWriter struct {
	mu sync.Mutex
	w  strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}
