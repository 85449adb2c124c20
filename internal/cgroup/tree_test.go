package cgroup_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
)

// TestRemoveTree: a tree with a process in its deepest cgroup is removed in
// every root; the process moves to the root, or is killed with Kill.
func TestRemoveTree(t *testing.T) {
	h := cgrouptest.Kernel(t)
	roots := []string{h.CPURoot}
	if h.AcctRoot != "" {
		roots = append(roots, h.AcctRoot)
	}
	for _, kill := range []bool{false, true} {
		t.Run(fmt.Sprintf("kill=%v", kill), func(t *testing.T) {
			top := fmt.Sprintf("/cpuslot-test-tree-%d-%v", os.Getpid(), kill)
			leaf := top + "/a/b"
			for _, r := range roots {
				if err := os.MkdirAll(filepath.Join(r, leaf), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(filepath.Join(r, top, "c"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command("sleep", "600")
			if err := h.StartIn(cmd, leaf); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			defer func() {
				cmd.Process.Kill()
				<-exited
				h.RemoveTree(top, cgroup.TreeOptions{Kill: true, Wait: 5 * time.Second})
			}()
			if err := h.RemoveTree(top, cgroup.TreeOptions{Kill: kill, Wait: 10 * time.Second}); err != nil {
				t.Fatal(err)
			}
			for _, r := range roots {
				if _, err := os.Stat(filepath.Join(r, top)); !os.IsNotExist(err) {
					t.Errorf("%s still there (%v)", filepath.Join(r, top), err)
				}
			}
			if kill {
				// Wait returns once the kernel has reaped it: no time bound
				// of ours, go test's -timeout is the backstop.
				if err := <-exited; err == nil {
					t.Error("the process in the tree exited cleanly, want killed")
				}
				exited <- nil
				return
			}
			select {
			case err := <-exited:
				t.Fatalf("the process in the tree exited (%v), want it moved", err)
			default:
			}
			if p, err := h.PathOfPID(cmd.Process.Pid); err != nil || p != "/" {
				t.Errorf("the process is in %q (%v), want the root", p, err)
			}
		})
	}
}

// TestRemoveTreeRefusesRoot: the remover takes only trees below the
// hierarchy's root, and a missing tree is nothing to do.
func TestRemoveTreeRefusesRoot(t *testing.T) {
	root := t.TempDir()
	for _, dir := range []string{root, filepath.Dir(root), filepath.Join(root, "..", "x")} {
		if err := cgroup.RemoveTree(root, dir, cgroup.TreeOptions{}); err == nil {
			t.Errorf("RemoveTree(%s, %s) accepted", root, dir)
		}
	}
	if err := cgroup.RemoveTree(root, filepath.Join(root, "missing"), cgroup.TreeOptions{}); err != nil {
		t.Errorf("a missing tree: %v", err)
	}
	if _, err := os.Stat(root); err != nil {
		t.Fatal(err)
	}
}
