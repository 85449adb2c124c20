package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
)

// testbed is what one benchmark run sets up and removes: containers below
// a cgroup of the run's own, and an in-process agent whose socket lives in
// a temp dir.
type testbed struct {
	h    *cgroup.Hierarchy
	root string // the run's cgroup
	dir  string // temp dir of the agent's socket
	stop func()
}

// newTestbed checks for root and makes the temp dir; name goes into the
// run's cgroup name.
func newTestbed(name string) (*testbed, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("needs root to create cgroups")
	}
	h, err := cgroup.Detect()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "slotbench")
	if err != nil {
		return nil, err
	}
	os.Chmod(dir, 0o755)
	return &testbed{h: h, root: fmt.Sprintf("/cpuslot-%s-%d", name, os.Getpid()), dir: dir}, nil
}

// container makes cgroup name below the run's in every hierarchy (on v2
// with the cpu controller) and returns its path.
func (b *testbed) container(name string) (string, error) {
	rel := b.root + "/" + name
	for _, r := range []string{b.h.CPURoot, b.h.AcctRoot} {
		if r == "" {
			continue
		}
		if err := os.MkdirAll(filepath.Join(r, rel), 0o755); err != nil {
			return "", err
		}
	}
	if err := b.h.DelegateCPU(b.root); err != nil {
		return "", err
	}
	return rel, nil
}

// config is the agent's default configuration with its socket in the temp
// dir and no HTTP listener.
func (b *testbed) config() agent.Config {
	cfg := agent.DefaultConfig()
	cfg.Socket = filepath.Join(b.dir, "agent.sock")
	cfg.HTTP = ""
	return cfg
}

// run runs a on sources until close, and returns once it is ready.
func (b *testbed) run(a *agent.Agent, sources ...discover.Source) error {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, sources, true) }()
	for !a.Ready() {
		select {
		case err := <-done:
			cancel()
			return fmt.Errorf("agent: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	b.stop = func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "slotbench: agent:", err)
		}
	}
	return nil
}

// close stops the agent and removes the run's cgroups and temp dir.
func (b *testbed) close() {
	if b.stop != nil {
		b.stop()
	}
	os.RemoveAll(b.dir)
	if err := b.h.RemoveTree(b.root, cgroup.TreeOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "slotbench: cleanup:", err)
	}
}
