package cgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
)

// The v2 implementation on a directory of plain files laid out as cgroup
// v2 shows it (this host's cpu controller is on v1): the test reads back
// what was written. How the kernel answers is tested in the VM
// (v2_test.go).
func TestV2OnPlainFiles(t *testing.T) {
	root := t.TempDir()
	put(t, root, "cgroup.controllers", "cpuset cpu io memory pids\n")
	mounts := []*mountinfo.Info{{FSType: "cgroup2", Root: "/", Mountpoint: root, VFSOptions: "rw"}}
	h, err := detect(mounts, func(dir string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, "cgroup.controllers")) })
	if err != nil {
		t.Fatal(err)
	}
	if !h.ConfinesFDs() || h.ThreadsFile() != "cgroup.threads" || !strings.HasPrefix(h.String(), "cgroup v2 at ") {
		t.Fatalf("detected %s: confines fds %t, threads file %s", h, h.ConfinesFDs(), h.ThreadsFile())
	}
	if place, stat := h.SlotFDs(); place != 1 || stat != 1 {
		t.Fatalf("SlotFDs %d, %d; want 1, 1", place, stat)
	}

	if err := os.MkdirAll(filepath.Join(root, "pod/ctr"), 0o755); err != nil {
		t.Fatal(err)
	}
	put(t, root, "pod/cgroup.subtree_control", "")
	if err := h.DelegateCPU("/pod"); err != nil || get(t, root, "pod/cgroup.subtree_control") != "+cpu" {
		t.Fatalf("DelegateCPU: %v", err)
	}
	ctr := filepath.Join(root, "pod/ctr")
	put(t, ctr, "cgroup.controllers", "memory pids")
	put(t, ctr, "cgroup.subtree_control", "")
	put(t, ctr, "cpu.max", "")
	if _, err := h.Container("/pod/ctr", nil); err == nil || !strings.Contains(err.Error(), "lacks the cpu controller") {
		t.Fatalf("a container without the cpu controller opened: %v", err)
	}
	put(t, ctr, "cgroup.controllers", "cpu memory pids")
	if err := h.SetLimit("/pod/ctr", 500); err != nil || get(t, ctr, "cpu.max") != "50000 100000" {
		t.Fatalf("SetLimit: %v, cpu.max %q", err, get(t, ctr, "cpu.max"))
	}
	c, err := h.Container("/pod/ctr", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if m, err := c.LimitMilli(); err != nil || m != 500 {
		t.Fatalf("LimitMilli %d, %v; want 500", m, err)
	}

	// A slot an earlier agent left before it became threaded: adopting
	// makes it threaded, enables +cpu and reads back its spec.
	slot := filepath.Join(ctr, SlotName(7))
	if err := os.Mkdir(slot, 0o755); err != nil {
		t.Fatal(err)
	}
	put(t, slot, "cgroup.type", "")
	put(t, slot, "cpu.max", "25000 100000")
	put(t, slot, "cpu.weight", "25")
	slots, err := c.AdoptSlots()
	if err != nil || len(slots) != 1 {
		t.Fatalf("adopted %d slots: %v", len(slots), err)
	}
	s := slots[0]
	if want := (Spec{QuotaMilli: 250, PeriodUS: DefaultPeriodUS, Limit: LimitBoth}); s.Spec() != want {
		t.Fatalf("adopted spec %+v; want %+v", s.Spec(), want)
	}
	if get(t, slot, "cgroup.type") != "threaded" || get(t, ctr, "cgroup.subtree_control") != "+cpu" {
		t.Fatalf("adopted slot: cgroup.type %q, container's subtree_control %q", get(t, slot, "cgroup.type"), get(t, ctr, "cgroup.subtree_control"))
	}

	// Retune writes cpu.max and cpu.weight (plain files: emptied first so
	// that what is read back is what was written).
	put(t, slot, "cpu.max", "")
	put(t, slot, "cpu.weight", "")
	if err := s.Retune(Spec{QuotaMilli: 1500, PeriodUS: 50000, Limit: LimitCap}); err != nil {
		t.Fatal(err)
	}
	if got, w := get(t, slot, "cpu.max"), get(t, slot, "cpu.weight"); got != "75000 50000" || w != "100" {
		t.Fatalf("after Retune to a 1500m cap: cpu.max %q, cpu.weight %q", got, w)
	}
	put(t, slot, "cpu.max", "")
	put(t, slot, "cpu.weight", "")
	if err := s.Retune(Spec{QuotaMilli: 1500, PeriodUS: 50000, Limit: LimitShare}); err != nil {
		t.Fatal(err)
	}
	if got, w := get(t, slot, "cpu.max"), get(t, slot, "cpu.weight"); got != "max 50000" || w != "150" {
		t.Fatalf("after Retune to a 1500m share: cpu.max %q, cpu.weight %q", got, w)
	}

	put(t, ctr, "cgroup.events", "populated 1\nfrozen 0\n")
	if p, err := c.Populated(); err != nil || !p {
		t.Fatalf("Populated %t, %v; want true", p, err)
	}
	put(t, ctr, "cgroup.events", "populated 0\nfrozen 0\n")
	if p, err := c.Populated(); err != nil || p {
		t.Fatalf("Populated %t, %v; want false", p, err)
	}

	// Unprepare keeps +cpu while a child is left, and removes it after.
	put(t, ctr, "cgroup.subtree_control", "")
	if err := c.Unprepare(); err != nil || get(t, ctr, "cgroup.subtree_control") != "" {
		t.Fatalf("Unprepare with a slot left: %v, subtree_control %q", err, get(t, ctr, "cgroup.subtree_control"))
	}
	if err := os.RemoveAll(slot); err != nil {
		t.Fatal(err)
	}
	if err := c.Unprepare(); err != nil || get(t, ctr, "cgroup.subtree_control") != "-cpu" {
		t.Fatalf("Unprepare: %v, subtree_control %q", err, get(t, ctr, "cgroup.subtree_control"))
	}
}

// put replaces a plain file's content.
func put(t *testing.T, dir, name, v string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
