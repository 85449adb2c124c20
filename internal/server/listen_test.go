package server

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestListenLongPath: a socket in a pod's emptyDir under the kubelet's
// directory has a path longer than sockaddr_un holds.
func TestListenLongPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pods", "0f3c2b1a-9d8e-4c7b-a6f5-e4d3c2b1a098", "volumes", "kubernetes.io~empty-dir", "cpuslot")
	path := filepath.Join(dir, "agent.sock")
	if len(path) < maxSunPath {
		path = filepath.Join(dir, strings.Repeat("x", maxSunPath-len(path)+4), "agent.sock")
	}
	ln, err := Listen(path)
	if err != nil {
		t.Fatalf("listen on a %d-byte path: %v", len(path), err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o666 {
		t.Fatalf("socket file: %v %v", fi, err)
	}
	// A client reaches it through a shorter name, as a pod does at its
	// own mount point.
	link := filepath.Join(t.TempDir(), "s")
	os.Symlink(filepath.Dir(path), link)
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	c, err := net.Dial("unix", filepath.Join(link, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("socket file left after Close: %v", err)
	}
}

// TestListenSymlinkSwap (issue: chmod follows a symlink): while the agent
// makes its socket, a process that can write the directory keeps replacing
// the socket with a symlink to a root-only file. The file's mode never
// changes; Listen either succeeds or fails with ErrSocketPathTaken.
func TestListenSymlinkSwap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the target is a root-owned file")
	}
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(target, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agent.sock")
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Swap only once a socket is there: the window is between bind
		// and whatever sets the mode.
		for !stop.Load() {
			if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
				os.Remove(path)
				os.Symlink(target, path)
			}
		}
	}()
	ok, taken := 0, 0
	for i := 0; i < 2000; i++ {
		ln, err := Listen(path)
		switch {
		case err == nil:
			ok++
			ln.Close()
		case errors.Is(err, ErrSocketPathTaken):
			taken++
		default:
			// The attacker removed the name between our steps.
			if !errors.Is(err, os.ErrNotExist) {
				t.Logf("listen: %v", err)
			}
		}
		if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o600 {
			stop.Store(true)
			<-done
			t.Fatalf("after %d listens the symlink's target is %v (%v)", i+1, fi.Mode(), err)
		}
	}
	stop.Store(true)
	<-done
	t.Logf("%d listens succeeded, %d refused a planted path", ok, taken)
}

// TestListenRefusesPlantedFiles: a symlink, file or directory at the
// socket's name is left alone and reported as ErrSocketPathTaken; a stale
// socket is replaced.
func TestListenRefusesPlantedFiles(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "target")
	os.WriteFile(target, []byte("x"), 0o600)
	plant := map[string]func(p string) error{
		"symlink":  func(p string) error { return os.Symlink(target, p) },
		"dangling": func(p string) error { return os.Symlink(filepath.Join(dir, "nothing"), p) },
		"file":     func(p string) error { return os.WriteFile(p, nil, 0o644) },
		"dir":      func(p string) error { return os.Mkdir(p, 0o755) },
	}
	for name, mk := range plant {
		p := filepath.Join(dir, name)
		if err := mk(p); err != nil {
			t.Fatal(err)
		}
		before, _ := os.Lstat(p)
		if _, err := Listen(p); !errors.Is(err, ErrSocketPathTaken) {
			t.Errorf("%s: got %v", name, err)
		}
		if after, err := os.Lstat(p); err != nil || after.Mode() != before.Mode() || !after.ModTime().Equal(before.ModTime()) {
			t.Errorf("%s changed: %v", name, err)
		}
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o600 {
		t.Errorf("target mode %v", fi.Mode())
	}
	p := filepath.Join(dir, "stale.sock")
	ln, err := Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	ln.UnixListener.Close() // a crash leaves the file behind
	ln2, err := Listen(p)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	ln2.Close()
}

func TestAcceptBackoff(t *testing.T) {
	var b acceptBackoff
	now := time.Unix(1000, 0)
	reports := 0
	var last time.Duration
	for i := 0; i < 1000; i++ {
		d, r, _ := b.failed(now)
		if r {
			reports++
		}
		if d < last || d > time.Second {
			t.Fatalf("wait %v after %v", d, last)
		}
		last = d
		now = now.Add(d)
	}
	if last != time.Second {
		t.Fatalf("wait did not grow to 1s: %v", last)
	}
	// 1000 failures take ~990s of waiting: one report per 10s at most.
	if reports > 100 {
		t.Fatalf("%d reports", reports)
	}
	b.reset()
	if d, _, n := b.failed(now); d != 5*time.Millisecond || n != 1 {
		t.Fatalf("after reset: %v %d", d, n)
	}
}

// TestListenerCloseTwice: the agent closes a pod's listener when the pod is
// forgotten and again in the teardown; the second close must not close
// the fd number the first one freed, now another file's.
func TestListenerCloseTwice(t *testing.T) {
	ln, err := Listen(filepath.Join(t.TempDir(), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	dir := ln.dir
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.DevNull) // likely takes the directory fd's number
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ln.Close()
	if int(f.Fd()) == dir {
		if _, err := f.Stat(); err != nil {
			t.Fatalf("the second Close closed fd %d, another file's now: %v", dir, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatalf("the file opened after the first Close was closed by the second: %v", err)
	}
}
