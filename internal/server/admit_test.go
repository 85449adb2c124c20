package server

import "testing"

// TestChargesShares: peers in no served container are bounded per user
// and per cgroup before HELLO, and all together by the node cap, within
// which a newcomer displaces a waiting connection of the cgroup that holds
// the most; a served container's share is its own, and a connection moves
// to it when its HELLO names the container.
func TestChargesShares(t *testing.T) {
	l := Limits{MaxConns: 10, MaxConnsPerContainer: 3, MaxPendingPerUID: 4, MaxPendingPerCgroup: 6}
	cs := newCharges()
	admitN := func(ch charge, n int) (ok int, admitted []charge, displaced []string) {
		for i := 0; i < n; i++ {
			c := ch
			if yes, d := cs.admit(&c, l); yes {
				ok++
				admitted = append(admitted, c)
				if d != "" {
					displaced = append(displaced, d)
					cs.pendingCgroup[d]-- // what Server.displace drops
					cs.node--
				}
			}
		}
		return ok, admitted, displaced
	}
	if n, _, _ := admitN(charge{uid: 1000, cgroup: "/user"}, 10); n != 4 {
		t.Fatalf("one user outside: %d admitted, want the per-UID cap 4", n)
	}
	if n, _, _ := admitN(charge{uid: 1001, cgroup: "/user"}, 10); n != 2 {
		t.Fatalf("another user in the same cgroup: %d admitted, want what the per-cgroup cap 6 leaves (2)", n)
	}
	n, pending, d := admitN(charge{uid: 1002, cgroup: "/other"}, 10)
	if n != 4 || len(d) != 0 {
		t.Fatalf("a third user: %d admitted (displacing %v), want the per-UID cap 4 (node cap 10 then full)", n, d)
	}
	// The node is full: a newcomer displaces a connection of the cgroup
	// that holds the most, until none holds more than one over it
	// (/user 6 -> 4, then /user or /other 4 -> 3 while /third gets 3).
	if m, _, d := admitN(charge{uid: 1003, cgroup: "/third"}, 4); m != 3 || len(d) != 3 || d[0] != "/user" || d[1] != "/user" {
		t.Fatalf("a newcomer at the full node cap: %d admitted, displacing %v; want 3, the first two of /user", m, d)
	}
	// The node is full, yet each served container has its share.
	for _, ctr := range []string{"/a", "/b"} {
		if m, _, _ := admitN(charge{container: ctr, uid: 0, cgroup: ctr}, 5); m != 3 {
			t.Fatalf("container %s: %d admitted, want its share 3", ctr, m)
		}
	}
	// A HELLO naming a container moves the connection to its share: the
	// node's place is free.
	if !cs.named(&pending[0], "/c", l) || cs.perContainer["/c"] != 1 {
		t.Fatal("HELLO did not move the connection to its container's share")
	}
	if m, _, d := admitN(charge{uid: 1004, cgroup: "/fourth"}, 1); m != 1 || len(d) != 0 {
		t.Fatalf("after a HELLO moved one: %d admitted (displacing %v), want 1 in the freed place", m, d)
	}
	cs.drop(&pending[0])
	if cs.perContainer["/c"] != 0 {
		t.Fatal("closing a moved connection left its container's count")
	}
	// A HELLO naming a full container's share is refused.
	if cs.named(&pending[1], "/a", l) {
		t.Fatal("HELLO moved a connection into a full container's share")
	}
}
