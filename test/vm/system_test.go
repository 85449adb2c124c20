package vm

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestSystemBootsSystemd boots the host's userland with systemd as PID 1 and
// checks what a cgroup v2 node relies on: systemd owns cgroup2, mounted with
// nsdelegate and memory_recursiveprot; the root is the overlay; the host's
// files are there; a writable tmpfs; Exec's output and exit codes.
func TestSystemBootsSystemd(t *testing.T) {
	RequireSystem(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root (qemu reads the host's root as the test's user)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	s, err := BootSystem(ctx, SystemOptions{
		Target: "cpuslot-vm-test.target",
		Etc: map[string]string{
			"systemd/system/cpuslot-vm-test.target": "[Unit]\nDescription=test/vm test target\nAllowIsolate=yes\n",
		},
		Tmpfs:    []string{"/var/lib/cpuslot-vm-test"},
		MemoryMB: 1024,
	}, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	t.Logf("control shell ready %v after qemu started", s.Uptime().Round(time.Millisecond))

	run := func(script string) string {
		t.Helper()
		out, code, err := s.Exec(ctx, script)
		if err != nil {
			t.Fatal(err)
		}
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", script, code, out)
		}
		return strings.TrimSpace(out)
	}
	if got := run("cat /proc/1/comm"); got != "systemd" {
		t.Errorf("PID 1 is %q, want systemd", got)
	}
	mnt := run("findmnt -n -o FSTYPE,OPTIONS /sys/fs/cgroup")
	for _, want := range []string{"cgroup2", "nsdelegate", "memory_recursiveprot"} {
		if !strings.Contains(mnt, want) {
			t.Errorf("/sys/fs/cgroup is %q, want %s in it", mnt, want)
		}
	}
	if got := run("findmnt -n -o FSTYPE /"); got != "overlay" {
		t.Errorf("/ is %q, want overlay", got)
	}
	if got := run("findmnt -n -o FSTYPE /var/lib/cpuslot-vm-test"); got != "tmpfs" {
		t.Errorf("/var/lib/cpuslot-vm-test is %q, want tmpfs", got)
	}
	if got := run("systemctl is-system-running || true"); got == "" {
		t.Error("systemctl is-system-running printed nothing")
	}
	if _, err := os.Stat("/etc/debian_version"); err == nil {
		host, _ := os.ReadFile("/etc/debian_version")
		if got := run("cat /etc/debian_version"); got != strings.TrimSpace(string(host)) {
			t.Errorf("guest /etc/debian_version %q, host's %q", got, host)
		}
	}
	// Exit codes and stderr come back; a command's failure is not an error.
	out, code, err := s.Exec(ctx, "echo out; echo err >&2; exit 3")
	if err != nil || code != 3 || !strings.Contains(out, "out") || !strings.Contains(out, "err") {
		t.Errorf("Exec = %q, %d, %v; want out and err, exit 3", out, code, err)
	}
	// A command that outlives its ctx: the error says so, and the next
	// Exec gets only its own output.
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	_, _, err = s.Exec(short, "sleep 5; echo late")
	cancelShort()
	if err == nil {
		t.Error("Exec of 'sleep 5' with a 2 s deadline returned no error")
	}
	if got := run("echo next"); got != "next" {
		t.Errorf("Exec after a timed-out one = %q, want %q", got, "next")
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("qemu still running after Stop")
	}
}
