package server

import "testing"

// TestChargesShares: peers in no served container are bounded per user
// and per cgroup before HELLO, and all together by the node cap; a served
// container's share is its own.
func TestChargesShares(t *testing.T) {
	l := Limits{MaxConns: 10, MaxConnsPerContainer: 3, MaxPendingPerUID: 4, MaxPendingPerCgroup: 6}
	cs := newCharges()
	admitN := func(ch charge, n int) (ok int, admitted []charge) {
		for i := 0; i < n; i++ {
			c := ch
			if cs.admit(&c, l) {
				ok++
				admitted = append(admitted, c)
			}
		}
		return ok, admitted
	}
	if n, _ := admitN(charge{uid: 1000, cgroup: "/user"}, 10); n != 4 {
		t.Fatalf("one user outside: %d admitted, want the per-UID cap 4", n)
	}
	if n, _ := admitN(charge{uid: 1001, cgroup: "/user"}, 10); n != 2 {
		t.Fatalf("another user in the same cgroup: %d admitted, want what the per-cgroup cap 6 leaves (2)", n)
	}
	n, pending := admitN(charge{uid: 1002, cgroup: "/other"}, 10)
	if n != 4 {
		t.Fatalf("a third user: %d admitted, want the per-UID cap 4 (node cap 10 then full)", n)
	}
	if m, _ := admitN(charge{uid: 1003, cgroup: "/third"}, 1); m != 0 {
		t.Fatal("admitted past the node cap")
	}
	// The node is full, yet each served container has its share.
	for _, ctr := range []string{"/a", "/b"} {
		if m, _ := admitN(charge{container: ctr, uid: 0, cgroup: ctr}, 5); m != 3 {
			t.Fatalf("container %s: %d admitted, want its share 3", ctr, m)
		}
	}
	// A connection that said HELLO leaves the per-UID count, not the node's.
	cs.identified(&pending[0])
	if m, _ := admitN(charge{uid: 1002, cgroup: "/other2"}, 1); m != 0 {
		t.Fatal("admitted past the node cap after a HELLO")
	}
	cs.drop(&pending[0])
	if m, _ := admitN(charge{uid: 1002, cgroup: "/other2"}, 2); m != 1 {
		t.Fatalf("after a close: %d admitted, want 1", m)
	}
}
