package server

import (
	"os/exec"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startSleeper starts a process that lives until killed and returns it
// with a pidfd of it (closed when the test ends).
func startSleeper(t *testing.T) (*exec.Cmd, int) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Skipf("no pidfds: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return cmd, fd
}

// TestWatchExit: gone runs once the watched process exits, also when it
// had exited before the watch began; a stopped watch frees its goroutine
// and never runs gone. Waits are bounded only so that a broken watch does
// not hang the test.
func TestWatchExit(t *testing.T) {
	cmd, fd := startSleeper(t)
	gone := make(chan struct{}, 1)
	if _, err := watchExit(fd, func() { gone <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
		t.Fatal("gone ran while the process lives")
	default:
	}
	cmd.Process.Kill()
	select {
	case <-gone:
	case <-time.After(time.Minute):
		t.Fatalf("a minute after process %d was killed, its watch had not seen it", cmd.Process.Pid)
	}
	// Exited (and reaped) before the watch began.
	cmd.Wait()
	if _, err := watchExit(fd, func() { gone <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(time.Minute):
		t.Fatal("a watch begun after the exit never saw it")
	}

	// Stopped watches end their goroutines and never run gone.
	before := runtime.NumGoroutine()
	var stops []func()
	for i := 0; i < 50; i++ {
		_, fd := startSleeper(t)
		stop, err := watchExit(fd, func() { gone <- struct{}{} })
		if err != nil {
			t.Fatal(err)
		}
		stops = append(stops, stop)
	}
	for _, stop := range stops {
		stop()
	}
	deadline := time.Now().Add(time.Minute)
	for n := runtime.NumGoroutine(); n > before; n = runtime.NumGoroutine() {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines a minute after 50 watches stopped, %d before", n, before)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case <-gone:
		t.Fatal("a stopped watch ran gone")
	default:
	}
}
