package cgroup_test

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
)

// witnessed makes cgroup rel in the node's first witness hierarchy too (as
// container runtimes make a container's path in every v1 hierarchy) and
// returns that hierarchy; it skips on v2 or without one.
func witnessed(t testing.TB, h *cgroup.Hierarchy, rels ...string) cgroup.Witness {
	t.Helper()
	if h.Version != 1 || len(h.Witnesses) == 0 {
		t.Skip("needs a cgroup v1 hierarchy besides cpu and cpuacct")
	}
	w := h.Witnesses[0]
	for _, rel := range rels {
		dir := filepath.Join(w.Root, rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			os.Remove(dir)
			os.Remove(filepath.Dir(dir)) // with the last of its children
		})
	}
	return w
}

// containerWithSlot opens the container at rel (closed when the test
// ends) and makes one 250m slot in it; the caller removes the slot.
func containerWithSlot(t testing.TB, h *cgroup.Hierarchy, rel string) (*cgroup.Container, *cgroup.Slot) {
	t.Helper()
	c, err := h.Container(rel, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := c.CreateSlot(1, cgroup.Spec{QuotaMilli: 250, PeriodUS: 100000, Limit: cgroup.LimitCap})
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// sleepers starts n processes in cgroup rel (and in rel of the witness
// hierarchy w, unless w is nil), ended when the test ends.
func sleepers(t testing.TB, h *cgroup.Hierarchy, w *cgroup.Witness, rel string, n int) []int {
	t.Helper()
	var pids []int
	for i := 0; i < n; i++ {
		cmd := exec.Command("sleep", "600")
		if err := h.StartIn(cmd, rel); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		if w != nil {
			if err := os.WriteFile(filepath.Join(w.Root, rel, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
				t.Fatal(err)
			}
		}
		pids = append(pids, cmd.Process.Pid)
	}
	return pids
}

// TestEvictForeignBounded: a scan checks at most the threads it is given
// and goes on where the last one stopped, so every foreign thread is found
// within ceil(threads/max) scans; the container's own threads stay.
func TestEvictForeignBounded(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	b := path.Join(path.Dir(rel), "b")
	for _, r := range append([]string{h.CPURoot}, h.AcctRoot) {
		if r != "" {
			if err := os.MkdirAll(filepath.Join(r, b), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	w := witnessed(t, h, rel, b)
	c, s := containerWithSlot(t, h, rel)
	defer s.Remove()
	if c.Witness() == nil || c.Witness().Key != w.Key {
		t.Fatalf("witness %+v, want %s", c.Witness(), w.Key)
	}
	own := sleepers(t, h, &w, rel, 2)
	foreign := sleepers(t, h, &w, b, 5)
	for _, pid := range append(append([]int{}, own...), foreign...) {
		if err := s.Place(pid); err != nil {
			t.Fatal(err)
		}
	}
	const max = 3
	scans := 0
	for left := len(foreign); left > 0; {
		if scans++; scans > 3 { // ceil(7/3)
			t.Fatalf("%d foreign threads left after %d scans of at most %d", left, scans-1, max)
		}
		sc, err := c.EvictForeign(max)
		if err != nil {
			t.Fatal(err)
		}
		if sc.Checked > max {
			t.Fatalf("scan checked %d threads, bound %d", sc.Checked, max)
		}
		for _, f := range sc.Foreign {
			if f.Err != nil || f.MovedTo != b || f.Home != b {
				t.Fatalf("foreign thread: %+v", f)
			}
		}
		left -= len(sc.Foreign)
	}
	for _, pid := range foreign {
		if p, _ := h.PathOfPID(pid); p != b {
			t.Errorf("B's process %d is in %s", pid, p)
		}
	}
	for _, pid := range own {
		if p, _ := h.PathOfPID(pid); p != path.Join(rel, s.Name()) {
			t.Errorf("the container's own process %d was moved to %s", pid, p)
		}
	}
}

// lockedNonLeader returns the TID of an OS thread of this process that is
// not its leader, locked until the test ends.
func lockedNonLeader(t *testing.T) int {
	tids := make(chan int)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	var spawn func()
	spawn = func() {
		runtime.LockOSThread()
		if syscall.Gettid() == os.Getpid() {
			go spawn() // stay locked to the leader; try another thread
		} else {
			tids <- syscall.Gettid()
		}
		<-stop
	}
	go spawn()
	return <-tids
}

// TestEvictForeignThreadToItsLeader: one thread of a process of another
// cgroup in a slot goes back to the cgroup its process's leader is in.
func TestEvictForeignThreadToItsLeader(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	witnessed(t, h, rel)
	c, s := containerWithSlot(t, h, rel)
	defer s.Remove()
	home, err := h.PathOfPID(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	tid := lockedNonLeader(t)
	if err := s.Place(tid); err != nil {
		t.Fatal(err)
	}
	sc, err := c.EvictForeign(100)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Foreign) != 1 || sc.Foreign[0].TID != tid || sc.Foreign[0].PID != os.Getpid() || sc.Foreign[0].MovedTo != home {
		t.Fatalf("scan: %+v, want thread %d moved to %s", sc, tid, home)
	}
	if p, _ := h.PathOfThread(os.Getpid(), tid); p != home {
		t.Fatalf("thread %d is in %s, want %s", tid, p, home)
	}
}

// TestEvictForeignWithoutWitness: a container whose path exists in no
// other v1 hierarchy is judged by the process leader's cpu cgroup. A
// thread whose leader stays outside is found and sent back to the
// leader's cgroup; a process whose leader was written into the slot as
// well is not found (the residual risk docs/security.md states).
func TestEvictForeignWithoutWitness(t *testing.T) {
	h := cgrouptest.Kernel(t)
	if h.Version != 1 {
		t.Skip("v1 only: on v2 the kernel refuses foreign threads")
	}
	rel := cgrouptest.NewContainer(t, h, 0)
	c, s := containerWithSlot(t, h, rel)
	defer s.Remove()
	if c.Witness() != nil {
		t.Fatalf("witness %+v for a container made in cpu and cpuacct only", c.Witness())
	}
	home, err := h.PathOfPID(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	tid := lockedNonLeader(t)
	if err := s.Place(tid); err != nil {
		t.Fatal(err)
	}
	whole := sleepers(t, h, nil, "/", 1)[0]
	if err := s.Place(whole); err != nil {
		t.Fatal(err)
	}
	sc, err := c.EvictForeign(100)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Foreign) != 1 || sc.Foreign[0].TID != tid || sc.Foreign[0].MovedTo != home || sc.Foreign[0].Err != nil {
		t.Fatalf("scan: %+v, want thread %d moved to %s", sc, tid, home)
	}
	if p, _ := h.PathOfThread(os.Getpid(), tid); p != home {
		t.Fatalf("thread %d is in %s, want %s", tid, p, home)
	}
	if p, _ := h.PathOfPID(whole); p != path.Join(rel, s.Name()) {
		t.Fatalf("process %d, leader and all, was moved to %s: the limit documented has changed", whole, p)
	}
}

// BenchmarkEvictForeign is the cost of one scan of a container's slots in
// which every thread is the container's own (the steady state): S slots of
// M threads each. Run as root on a v1 host:
//
//	go test -run '^$' -bench EvictForeign -benchtime 200x ./internal/cgroup/
func BenchmarkEvictForeign(b *testing.B) {
	h := cgrouptest.Kernel(b)
	// The floor: one read of one thread's cgroup file, which a scan does
	// for each thread it checks (compare in one run: the machine is noisy).
	b.Run("floor=read-proc-cgroup", func(b *testing.B) {
		pid := sleepers(b, h, nil, "/", 1)[0]
		name := fmt.Sprintf("/proc/%d/task/%d/cgroup", pid, pid)
		for i := 0; i < b.N; i++ {
			if _, err := os.ReadFile(name); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, sz := range []struct{ slots, threads int }{{1, 64}, {8, 64}, {64, 8}} {
		b.Run(fmt.Sprintf("slots=%d/threads=%d", sz.slots, sz.threads), func(b *testing.B) {
			rel := cgrouptest.NewContainer(b, h, 0)
			w := witnessed(b, h, rel)
			c, err := h.Container(rel, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			pids := sleepers(b, h, &w, rel, sz.slots*sz.threads)
			for i := 0; i < sz.slots; i++ {
				s, err := c.CreateSlot(uint32(i+1), cgroup.Spec{QuotaMilli: 250, PeriodUS: 100000, Limit: cgroup.LimitCap})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Remove() })
				for _, pid := range pids[i*sz.threads : (i+1)*sz.threads] {
					if err := s.Place(pid); err != nil {
						b.Fatal(err)
					}
				}
			}
			n := sz.slots * sz.threads
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				sc, err := c.EvictForeign(n)
				if err != nil || sc.Checked != n || len(sc.Foreign) != 0 {
					b.Fatalf("scan: %+v %v", sc, err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*n), "ns/thread")
		})
	}
}

// TestEvictForeignNeverToRoot: a process whose cgroup exists in cpu only
// (its witness cgroup is the hierarchy's root), written whole into a
// slot, has no cgroup of its own the agent can find. It is not sent to
// the root, where no limit holds it, but to the slot's container.
func TestEvictForeignNeverToRoot(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	w := witnessed(t, h, rel)
	c, s := containerWithSlot(t, h, rel)
	defer s.Remove()
	b := path.Join(path.Dir(rel), "b")
	for _, r := range []string{h.CPURoot, h.AcctRoot} {
		if r != "" {
			if err := os.MkdirAll(filepath.Join(r, b), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	victim := sleepers(t, h, nil, b, 1)[0]
	if err := os.WriteFile(filepath.Join(w.Root, "cgroup.procs"), []byte(strconv.Itoa(victim)), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Place(victim); err != nil {
		t.Fatal(err)
	}
	sc, err := c.EvictForeign(100)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Foreign) != 1 || sc.Foreign[0].TID != victim || sc.Foreign[0].MovedTo != rel || sc.Foreign[0].Err != nil {
		t.Fatalf("scan: %+v, want process %d moved to %s", sc, victim, rel)
	}
	if p, _ := h.PathOfPID(victim); p != rel {
		t.Fatalf("process %d is in %s, want %s", victim, p, rel)
	}
}

// TestRemoveSlotWithForeignThreadInCpuacctOnly: a holder may write a
// slot's cpuacct fd alone (v1, mounted apart). Removing the slot moves
// such a thread back to its own cgroup too, or the slot could not be
// removed (EBUSY) and a retired slot would stay.
func TestRemoveSlotWithForeignThreadInCpuacctOnly(t *testing.T) {
	h := cgrouptest.Kernel(t)
	if h.Version != 1 || h.AcctRoot == "" {
		t.Skip("needs cpuacct mounted apart from cpu (v1)")
	}
	rel := cgrouptest.NewContainer(t, h, 0)
	b := path.Join(path.Dir(rel), "b")
	for _, r := range []string{h.CPURoot, h.AcctRoot} {
		if err := os.MkdirAll(filepath.Join(r, b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	w := witnessed(t, h, rel, b)
	_, s := containerWithSlot(t, h, rel)
	pid := sleepers(t, h, &w, b, 1)[0]
	if err := os.WriteFile(filepath.Join(h.AcctRoot, rel, s.Name(), "tasks"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(); err != nil {
		t.Fatalf("removing the slot: %v", err)
	}
	own, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	if want := ":cpuacct:" + b + "\n"; !strings.Contains(string(own), want) {
		t.Fatalf("process %d's cgroups:\n%s\nwant cpuacct at %s", pid, own, b)
	}
}
