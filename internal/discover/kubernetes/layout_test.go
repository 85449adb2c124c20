package kubernetes

import (
	"context"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"github.com/cpuslot/cpuslot/internal/discover"
)

// TestUnrecognisedCgroupLayout: a selected pod whose container cgroup the
// agent cannot place in the node's hierarchy (containerd names it in a form
// neither cgroup driver writes, or names a cgroup that is not there, as on
// a node mounting its hierarchy elsewhere) gets a Warning Event saying so,
// a log line, and no pool: nothing is made anywhere in the hierarchy.
// Client-go's fake API stands in for the API server; agent and cgroups are
// real.
func TestUnrecognisedCgroupLayout(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 1000)
	parent := filepath.Dir(rel)
	for _, tc := range []struct {
		name, cgroupsPath, reason, says string
	}{
		{"unknown-form", "kubepods:cri-containerd", ReasonCgroupNotFound, "neither a path nor slice:prefix:name"},
		{"not-there", parent + "/elsewhere/ctr", ReasonPrepareFailed, "no such file or directory"},
		{"bad-slice", "kubepods-.slice:cri-containerd:c1", ReasonCgroupNotFound, "bad slice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			podsDir := t.TempDir()
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "fn", Namespace: "default", UID: "uid-l",
					Annotations: map[string]string{AnnEnabled: "true", AnnPrewarm: "250m=2"}},
				Spec: corev1.PodSpec{NodeName: "n1",
					Containers: []corev1.Container{{Name: "fn"}},
					Volumes:    []corev1.Volume{{Name: "cpuslot", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
					Name: "fn", ContainerID: "containerd://c1", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
			}
			cs := fake.NewSimpleClientset(pod)
			os.MkdirAll(filepath.Dir(SocketPath(podsDir, "uid-l", "cpuslot")), 0o777)
			cfg := agent.DefaultConfig()
			cfg.Socket, cfg.HTTP = "", ""
			logs := &syncWriter{w: &strings.Builder{}}
			log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			a, err := agent.New(cfg, log)
			if err != nil {
				t.Fatal(err)
			}
			pc, _ := cfg.Settings()
			src := New(Config{NodeName: "n1", PodsDir: podsDir, SocketVolume: "cpuslot",
				Selector: Selector{Annotated: true}, Pool: pc, Resync: time.Hour}, cs, h, log)
			src.cgroupOf = func(context.Context, string) (string, error) { return CgroupFromSpec(tc.cgroupsPath) }
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx, []discover.Source{src}, true) }()
			defer func() { cancel(); <-done }()
			var msg string
			waitUntil(t, "a Warning "+tc.reason+" event", func() bool {
				ev, _ := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
				for _, e := range ev.Items {
					if e.Type == corev1.EventTypeWarning && e.Reason == tc.reason && strings.Contains(e.Message, tc.says) {
						msg = e.Message
						return true
					}
				}
				return false
			})
			t.Logf("event %s: %s", tc.reason, msg)
			if s := a.Summaries(); len(s) != 0 {
				t.Fatalf("the agent serves %+v", s)
			}
			var made []string
			filepath.WalkDir(filepath.Join(h.CPURoot, parent), func(p string, d fs.DirEntry, err error) error {
				if _, slot := cgroup.ParseSlotName(d.Name()); err == nil && d.IsDir() && slot {
					made = append(made, p)
				}
				return nil
			})
			if len(made) != 0 {
				t.Fatalf("slots made: %v", made)
			}
			waitUntil(t, "a log line", func() bool { return strings.Contains(logs.String(), tc.says) })
		})
	}
}

// syncWriter lets the test read what the agent's logger wrote.
type syncWriter struct {
	mu sync.Mutex
	w  *strings.Builder
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
