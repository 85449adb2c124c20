package proc

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A running thread is not exiting; a process that has exited and is not
// reaped (a zombie) is, and so is an id that names nothing.
func TestExiting(t *testing.T) {
	if Exiting(unix.Gettid()) || Exiting(os.Getpid()) {
		t.Fatal("this running process reads as exiting")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	pid := cmd.Process.Pid
	for deadline := time.Now().Add(time.Minute); ; {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err == nil && strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d did not become a zombie within a minute: %q, %v", pid, b, err)
		}
		time.Sleep(time.Millisecond)
	}
	if !Exiting(pid) {
		t.Fatalf("zombie %d does not read as exiting", pid)
	}
	cmd.Wait()
	if !Exiting(pid) {
		t.Fatalf("reaped %d does not read as exiting", pid)
	}
}
