package kubernetes

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// TestKnownCgroup: a container the runtime already showed the agent (its
// NRI plugin, Config.Known) is served without asking containerd, which a
// CRI-O node does not run; the pool the plugin made is found, not made
// again.
func TestKnownCgroup(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	podsDir := t.TempDir()
	os.MkdirAll(filepath.Dir(SocketPath(podsDir, "uid-k", "cpuslot")), 0o777)
	cfg := agent.DefaultConfig()
	cfg.Socket, cfg.HTTP = "", ""
	cfg.ReapInterval = agent.Duration{Duration: time.Hour}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := agent.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	pc, _ := cfg.Settings()
	src := New(Config{NodeName: "n1", PodsDir: podsDir, SocketVolume: "cpuslot", Selector: Selector{Annotated: true},
		Pool: pc, Ceilings: settings.DefaultCeilings(), Resync: time.Hour,
		Known: func(id string) (string, bool) { return rel, id == "c1" }},
		fake.NewSimpleClientset(selectedPod("uid-k", "250m=1", corev1.ResourceRequirements{})), h, log)
	src.cgroupOf = func(context.Context, string) (string, error) {
		t.Error("asked containerd for a container the runtime showed")
		return "", errors.New("no containerd")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, []discover.Source{src}, true) }()
	t.Cleanup(func() { cancel(); <-done })
	waitUntil(t, "agent ready", a.Ready)
	if s := a.Summaries(); len(s) != 1 || s[0].Name != ContainerName("default", "fn", "fn") {
		t.Fatalf("served %+v", s)
	}
}
