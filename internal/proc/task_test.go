package proc

import (
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestOwnThreads(t *testing.T) {
	pid, tid := os.Getpid(), unix.Gettid()
	tids, err := Threads(pid)
	if err != nil || !slices.Contains(tids, pid) || !slices.Contains(tids, tid) {
		t.Fatalf("Threads(%d) = %v, %v; want %d and %d in it", pid, tids, err, pid, tid)
	}
	if !IsThreadOf(pid, tid) || IsThreadOf(pid, 0) {
		t.Fatalf("IsThreadOf(%d, %d) false, or IsThreadOf(%d, 0) true", pid, tid, pid)
	}
	if n := NSpid(pid, tid); n != uint32(tid) {
		t.Fatalf("NSpid(%d, %d) = %d", pid, tid, n)
	}
	if h, err := FindHostTID(pid, uint32(tid)); err != nil || h != tid {
		t.Fatalf("FindHostTID(%d, %d) = %d, %v", pid, tid, h, err)
	}
	if _, err := FindHostTID(pid, 1<<31); err == nil {
		t.Fatal("FindHostTID found a thread that does not exist")
	}
}

func TestOwnPIDNamespace(t *testing.T) {
	ns, err := PIDNamespace(os.Getpid())
	if err != nil || ns == 0 {
		t.Fatalf("PIDNamespace = %d, %v", ns, err)
	}
	if in, err := InPIDNamespace(os.Getpid(), ns); err != nil || !in {
		t.Fatalf("InPIDNamespace(self, own) = %v, %v", in, err)
	}
	if in, err := InPIDNamespace(os.Getpid(), ns+1); err != nil || in {
		t.Fatalf("InPIDNamespace(self, other) = %v, %v", in, err)
	}
}
