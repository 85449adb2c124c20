package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	home string // this process's cgroup before favorAgent moved it
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

// favorAgent moves this process, the agent, into a cgroup of its own below
// the run's, which favor gives the largest CPU weight: on a loaded machine
// the agent's answers would otherwise wait for a CPU behind other work (a
// node agent has a CPU request of its own). close moves it back.
func (b *testbed) favorAgent() error {
	b2, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	home, ok := cpuCgroup(string(b2), b.h.Version)
	if !ok {
		return fmt.Errorf("no cpu cgroup in /proc/self/cgroup")
	}
	rel, err := b.container("agent")
	if err != nil {
		return err
	}
	if err := b.h.MoveProcess(os.Getpid(), rel); err != nil {
		return err
	}
	b.home = home
	return nil
}

// cpuCgroup is the cgroup of the cpu controller in a /proc/<pid>/cgroup
// text: v2's "0::" line, or the v1 line whose controllers hold cpu.
func cpuCgroup(procCgroup string, version int) (string, bool) {
	for _, line := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if version == 2 && f[0] == "0" && f[1] == "" {
			return f[2], true
		}
		if version == 1 && slices.Contains(strings.Split(f[1], ","), "cpu") {
			return f[2], true
		}
	}
	return "", false
}

// close stops the agent and removes the run's cgroups and temp dir.
func (b *testbed) close() {
	if b.stop != nil {
		b.stop()
	}
	if b.home != "" {
		if err := b.h.MoveProcess(os.Getpid(), b.home); err != nil {
			fmt.Fprintln(os.Stderr, "slotbench: cleanup:", err)
		}
	}
	os.RemoveAll(b.dir)
	if err := b.h.RemoveTree(b.root, cgroup.TreeOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "slotbench: cleanup:", err)
	}
}
