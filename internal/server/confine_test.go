package server

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startInPIDNS starts argv as the init of a new PID namespace.
func startInPIDNS(t *testing.T, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot make a PID namespace: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// childOf waits for the first child of pid and returns it.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
		if f := strings.Fields(string(b)); len(f) > 0 {
			c, _ := strconv.Atoi(f[0])
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d started no child", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConfined: the v1 rule for placement fds on real namespaces. A pod's
// namespace holds all of its container; a namespace nested below a
// process that lives outside it does not; nor does one whose init is not
// listed as the container's.
func TestConfined(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make PID namespaces")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1)")
	}
	// pod: init of namespace N; below it, nested: init of N2 inside N.
	pod := startInPIDNS(t, "unshare", "--pid", "--fork", "sleep", "1000")
	nested := childOf(t, pod.Process.Pid)
	n, n2 := nsInode(pod.Process.Pid), nsInode(nested)
	if n == 0 || n2 == 0 || n == n2 || n == nsInode(os.Getpid()) {
		t.Fatalf("namespaces: pod %d, nested %d", n, n2)
	}
	self := os.Getpid()
	for _, tc := range []struct {
		name  string
		ns    uint64
		procs []int
		ok    bool
	}{
		{"a pod and a namespace it made", n, []int{pod.Process.Pid, nested}, true},
		{"a pod alone", n, []int{pod.Process.Pid}, true},
		{"a nested namespace beside a process outside it", n2, []int{pod.Process.Pid, nested}, false},
		{"a pod's namespace beside a host process", n, []int{self, pod.Process.Pid}, false},
		{"a namespace whose init is elsewhere", n, []int{nested}, false},
		{"exited processes are skipped", n, []int{pod.Process.Pid, 1 << 30}, true},
	} {
		err := confined(tc.ns, tc.procs)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, errNotConfined) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
