package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// TreeOptions say what RemoveTree does with what still runs in the tree.
type TreeOptions struct {
	// Kill sends SIGKILL to the processes in the tree. Without it their
	// threads move to the hierarchy's root (whole processes on v2, whose
	// threaded subtrees do not let single threads leave).
	Kill bool
	// Wait is how long to keep retrying while a directory is busy (tasks
	// still leaving, a dying process); a few immediate retries are always
	// made.
	Wait time.Duration
}

// RemoveTree removes the cgroup at rel and every cgroup below it, deepest
// first, in each hierarchy the cpu controller spans. It is the one remover
// of whole cgroup trees (node-agent cleanup -tree; test, demo and e2e
// trees); the agent's own teardown removes slots only (RemoveAllSlots).
func (h *Hierarchy) RemoveTree(rel string, o TreeOptions) error {
	roots := []string{h.CPURoot}
	if h.AcctRoot != "" {
		roots = append(roots, h.AcctRoot)
	}
	var errs []error
	for _, r := range roots {
		if err := RemoveTree(r, filepath.Join(r, rel), o); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RemoveTree removes the cgroup directory dir and every cgroup below it,
// deepest first, in the hierarchy (v1 or v2, any controller) mounted at
// root. A tree that does not exist is no error. cgroupfs holds no
// symlinks, so walking it by path follows none.
func RemoveTree(root, dir string, o TreeOptions) error {
	root, dir = filepath.Clean(root), filepath.Clean(dir)
	if r, err := filepath.Rel(root, dir); err != nil || r == "." || r == ".." || strings.HasPrefix(r, "../") {
		return fmt.Errorf("cgroup tree %s: not below the hierarchy root %s", dir, root)
	}
	deadline := time.Now().Add(o.Wait)
	for {
		dirs, err := treeDirs(dir)
		if err != nil || len(dirs) == 0 {
			return err
		}
		var pids []int
		if o.Kill {
			pids = killTree(dirs)
		} else {
			evictTree(root, dirs)
		}
		var last error
		for _, d := range dirs {
			if err := rmdirRetry(d); err != nil {
				last = err
			}
		}
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			if len(pids) > 0 {
				return fmt.Errorf("cgroup tree %s: processes %v do not exit: %w", dir, pids, last)
			}
			return last
		}
		// A cgroup whose last task just left or died can be busy for a
		// moment.
		time.Sleep(100 * time.Millisecond)
	}
}

// treeDirs lists dir and the directories below it, deepest first.
func treeDirs(dir string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed meanwhile
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	sort.SliceStable(dirs, func(i, j int) bool {
		return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/")
	})
	return dirs, err
}

func rmdirRetry(d string) error {
	var err error
	for i := 0; i < 20; i++ {
		if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
	}
	return fmt.Errorf("rmdir %s: %w", d, err)
}

// evictTree moves every thread in dirs to the root: by thread on v1
// (tasks), by process on v2 (cgroup.threads is there).
func evictTree(root string, dirs []string) {
	for _, d := range dirs {
		if tids, err := readLines(filepath.Join(d, "cgroup.threads")); err == nil {
			for _, t := range tids {
				if tid, err := strconv.Atoi(t); err == nil {
					_ = os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(strconv.Itoa(tgidOf(tid))), 0)
				}
			}
			continue
		}
		tids, _ := readLines(filepath.Join(d, "tasks"))
		for _, t := range tids {
			_ = os.WriteFile(filepath.Join(root, "tasks"), []byte(t), 0)
		}
	}
}

// killTree sends SIGKILL to every process in dirs and returns them.
func killTree(dirs []string) []int {
	var pids []int
	for _, d := range dirs {
		lines, _ := readLines(filepath.Join(d, "cgroup.procs"))
		for _, l := range lines {
			if pid, err := strconv.Atoi(l); err == nil && pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// tgidOf is the process a thread belongs to (the thread itself when it is
// gone).
func tgidOf(tid int) int {
	lines, err := readLines("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return tid
	}
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, "Tgid:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n
			}
		}
	}
	return tid
}
