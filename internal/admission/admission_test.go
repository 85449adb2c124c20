package admission

import "testing"

func TestUnlimitedAlwaysGrants(t *testing.T) {
	b := New(0, 2, Reject, 10)
	for i := 0; i < 100; i++ {
		if d, g, _ := b.Admit(4000); d != Grant || g != 4000 {
			t.Fatalf("got %v %d", d, g)
		}
		b.Take(4000)
	}
}

func TestOvercommit(t *testing.T) {
	b := New(1000, 1.5, Reject, 10)
	if b.Limit != 1500 {
		t.Fatalf("limit %d", b.Limit)
	}
	b.Take(1000)
	if d, _, _ := b.Admit(500); d != Grant {
		t.Fatal("500 of 500 free should fit")
	}
	b.Take(500)
	if d, _, reason := b.Admit(10); d != Refuse || reason == "" {
		t.Fatalf("reject policy: %v %q", d, reason)
	}
	b.Give(500)
	if b.Used() != 1000 || b.Free() != 500 {
		t.Fatalf("used %d free %d", b.Used(), b.Free())
	}
}

func TestQueueWaitsButRefusesImpossible(t *testing.T) {
	b := New(1000, 1, Queue, 10)
	b.Take(800)
	if d, _, _ := b.Admit(300); d != Wait {
		t.Fatalf("want Wait, got %v", d)
	}
	if d, _, reason := b.Admit(1200); d != Refuse || reason == "" {
		t.Fatalf("a quota above the budget can never fit: %v", d)
	}
}

func TestDegradeGrantsWhatIsLeft(t *testing.T) {
	b := New(1000, 1, Degrade, 50)
	b.Take(700)
	if d, g, _ := b.Admit(500); d != Grant || g != 300 {
		t.Fatalf("got %v %d, want Grant 300", d, g)
	}
	b.Take(300)
	if d, _, _ := b.Admit(500); d != Wait {
		t.Fatalf("nothing left: want Wait, got %v", d)
	}
	b.Give(960)
	if d, _, _ := b.Admit(100); d != Grant {
		t.Fatal("should fit")
	}
	b2 := New(1000, 1, Degrade, 50)
	b2.Take(980)
	if d, _, _ := b2.Admit(100); d != Wait {
		t.Fatalf("20m left is below the 50m minimum: want Wait, got %v", d)
	}
}

func TestParsePolicy(t *testing.T) {
	for s, want := range map[string]Policy{"queue": Queue, "degrade": Degrade, "reject": Reject} {
		if p, err := ParsePolicy(s); err != nil || p != want {
			t.Errorf("%q: %v %v", s, p, err)
		}
	}
	for _, s := range []string{"drop", "", "Queue"} {
		if _, err := ParsePolicy(s); err == nil {
			t.Errorf("accepted %q", s)
		}
	}
}

// TestNoWrap: a quota near 2^32 does not wrap the sum of what is granted
// (issue: 250m held plus 2^32-250m fit a 1-core budget).
func TestNoWrap(t *testing.T) {
	for _, p := range []Policy{Queue, Degrade, Reject} {
		b := New(1000, 1, p, 10)
		b.Take(250)
		if d, g, _ := b.Admit(1<<32 - 250); d == Grant && g > b.Free() {
			t.Errorf("%v: granted %dm with %dm free", p, g, b.Free())
		}
		b.Take(1<<32 - 1)
		if b.Used() != 1<<32-1 || b.Fits(1) {
			t.Errorf("%v: used wrapped to %d", p, b.Used())
		}
	}
}
