package server

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
