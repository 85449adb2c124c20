package slotv1

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tableVector is one entry of testdata/table.json: an operation applied to
// the table image Before gives the image After, with Result and Index.
type tableVector struct {
	Name   string            `json:"name"`
	Op     string            `json:"op"`
	Args   map[string]uint64 `json:"args"`
	Before string            `json:"before,omitempty"`
	After  string            `json:"after"`
	Result string            `json:"result"`
	Index  int               `json:"index"`
}

// tableInvalid is a table image a reader must refuse; Error names the
// field found wrong, Layout says it is a table of another layout version.
type tableInvalid struct {
	Name   string `json:"name"`
	Hex    string `json:"hex"`
	Error  string `json:"error"`
	Layout bool   `json:"layout"`
}

type tableFile struct {
	Comment string         `json:"comment"`
	Ops     string         `json:"ops"`
	Valid   []tableVector  `json:"valid"`
	Invalid []tableInvalid `json:"invalid"`
}

const tableOps = "format{capacity}: an empty table. " +
	"claim{index,tid,quota,now}: Claim; index is the entry claimed or -1. " +
	"release{index,now}: Release of the claim whose state word Before holds. " +
	"control{index}: Control (claim with holder CONTROL). " +
	"clear{index,now}: Clear of the CONTROL claim whose state word Before holds. " +
	"publish{slot,quota_m,period_us,flags,lease,asked_m,holder,now}: Publish; result ok or full, index the entry written. " +
	"find{quota,from}: Find; index the entry found or -1. " +
	"mark_gone{index}, set_lease{index,lease}."

// alignedBytes is n zero bytes, 8-aligned as a mapping is.
func alignedBytes(n int) []byte {
	u := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&u[0])), n)
}

func imageOf(t *testing.T, h string) []byte {
	t.Helper()
	raw, err := hex.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	b := alignedBytes(len(raw))
	copy(b, raw)
	return b
}

// applyOp runs one vector's operation on tb (nil for format).
func applyOp(tb *Table, op string, a map[string]uint64) (*Table, string, int) {
	i := int(a["index"])
	switch op {
	case "format":
		t, err := FormatTable(alignedBytes(TableSize(int(a["capacity"]))))
		if err != nil {
			return nil, err.Error(), -1
		}
		return t, "ok", -1
	case "claim":
		c, r := tb.Claim(i, uint32(a["tid"]), uint32(a["quota"]), a["now"])
		if r != Claimed {
			return tb, r.String(), -1
		}
		return tb, r.String(), c.Index
	case "release":
		tb.Release(Claim{Index: i, State: tb.State(i)}, a["now"])
	case "control":
		c, r := tb.Control(i)
		if r != Claimed {
			return tb, r.String(), -1
		}
		return tb, r.String(), c.Index
	case "clear":
		tb.Clear(Claim{Index: i, State: tb.State(i)}, a["now"])
	case "publish":
		c, err := tb.Publish(Entry{Slot: uint32(a["slot"]), QuotaMilli: uint32(a["quota_m"]), PeriodUS: uint32(a["period_us"]),
			Flags: uint32(a["flags"]), Lease: a["lease"], AskedMilli: uint32(a["asked_m"])}, uint32(a["holder"]), a["now"])
		if errors.Is(err, ErrTableFull) {
			return tb, "full", -1
		}
		return tb, "ok", c.Index
	case "find":
		return tb, "ok", tb.Find(uint32(a["quota"]), int(a["from"]))
	case "mark_gone":
		tb.MarkGone(i)
	case "set_lease":
		tb.SetLease(i, a["lease"])
	case "set_granted":
		tb.SetGranted(i, uint32(a["quota_m"]), a["degraded"] != 0)
	case "free_dead":
		if !tb.FreeDead(i, tb.State(i), a["now"]) {
			return tb, "unchanged", -1
		}
	default:
		panic("unknown op " + op)
	}
	return tb, "ok", -1
}

// tableCases runs a short history of a 3-entry table and records each step.
func tableCases(t *testing.T) []tableVector {
	var out []tableVector
	var cur *Table
	step := func(name, op string, a map[string]uint64) {
		v := tableVector{Name: name, Op: op, Args: a}
		var tb *Table
		if cur != nil {
			v.Before = hex.EncodeToString(cur.Bytes())
			var err error
			if tb, err = NewTable(imageOf(t, v.Before)); err != nil {
				t.Fatal(err)
			}
		}
		tb, v.Result, v.Index = applyOp(tb, op, a)
		v.After = hex.EncodeToString(tb.Bytes())
		cur = tb
		out = append(out, v)
	}
	const ms = 1_000_000
	step("format_3", "format", map[string]uint64{"capacity": 3})
	step("publish_free", "publish", map[string]uint64{"slot": 12, "quota_m": 250, "period_us": 100000, "flags": 0, "lease": 0x0102030405060708, "asked_m": 250, "holder": 0, "now": 1000 * ms})
	step("publish_to_thread_degraded", "publish", map[string]uint64{"slot": 7, "quota_m": 300, "period_us": 100000, "flags": EntryDegraded, "lease": 41, "asked_m": 333, "holder": 4242, "now": 1001 * ms})
	step("find_free_250", "find", map[string]uint64{"quota": 250, "from": 0})
	step("find_held_333", "find", map[string]uint64{"quota": 333, "from": 1})
	step("claim_free", "claim", map[string]uint64{"index": 0, "tid": 4243, "quota": 250, "now": 1002 * ms})
	step("claim_held", "claim", map[string]uint64{"index": 0, "tid": 99, "quota": 250, "now": 1003 * ms})
	step("control_held", "control", map[string]uint64{"index": 1})
	step("release", "release", map[string]uint64{"index": 0, "now": 1004 * ms})
	step("release_published", "release", map[string]uint64{"index": 1, "now": 1005 * ms})
	step("claim_other_quota", "claim", map[string]uint64{"index": 0, "tid": 4243, "quota": 333, "now": 1006 * ms})
	step("claim_empty", "claim", map[string]uint64{"index": 2, "tid": 4243, "quota": 250, "now": 1007 * ms})
	step("set_lease", "set_lease", map[string]uint64{"index": 0, "lease": 77})
	step("mark_gone", "mark_gone", map[string]uint64{"index": 1})
	step("find_gone", "find", map[string]uint64{"quota": 333, "from": 0})
	step("claim_gone", "claim", map[string]uint64{"index": 1, "tid": 4242, "quota": 333, "now": 1008 * ms})
	step("control_free", "control", map[string]uint64{"index": 1})
	step("clear", "clear", map[string]uint64{"index": 1, "now": 1009 * ms})
	step("publish_into_dropped", "publish", map[string]uint64{"slot": 9, "quota_m": 1200, "period_us": 50000, "flags": 0, "lease": 90, "asked_m": 1200, "holder": 0, "now": 1010 * ms})
	step("publish_last", "publish", map[string]uint64{"slot": 3, "quota_m": 150, "period_us": 100000, "flags": 0, "lease": 91, "asked_m": 150, "holder": 4244, "now": 1011 * ms})
	step("publish_full", "publish", map[string]uint64{"slot": 4, "quota_m": 750, "period_us": 100000, "flags": 0, "lease": 92, "asked_m": 750, "holder": 0, "now": 1012 * ms})
	step("find_wraps", "find", map[string]uint64{"quota": 250, "from": 2})
	// The generation wraps at 2^32.
	cur.store64(entryOff(0)+offState, 0xFFFFFFFF<<32)
	step("claim_generation_wraps", "claim", map[string]uint64{"index": 0, "tid": 7, "quota": 250, "now": 1013 * ms})
	step("release_generation_0", "release", map[string]uint64{"index": 0, "now": 1014 * ms})
	// HELD_OK's grants; a dead holder's claim freed.
	step("set_granted_degraded", "set_granted", map[string]uint64{"index": 1, "quota_m": 600, "degraded": 1})
	step("set_granted_raised", "set_granted", map[string]uint64{"index": 1, "quota_m": 1200, "degraded": 0})
	step("free_dead", "free_dead", map[string]uint64{"index": 2, "now": 1015 * ms})
	step("free_dead_free", "free_dead", map[string]uint64{"index": 2, "now": 1016 * ms})
	return out
}

// tableInvalidCases are images a reader refuses, made from a valid one.
func tableInvalidCases(t *testing.T) []tableInvalid {
	good := func(n int) []byte {
		tb, err := FormatTable(alignedBytes(TableSize(n)))
		if err != nil {
			t.Fatal(err)
		}
		return tb.Bytes()
	}
	mod := func(n int, f func(b []byte)) string { b := good(n); f(b); return hex.EncodeToString(b) }
	return []tableInvalid{
		{"bad_magic", mod(1, func(b []byte) { b[7] = 't' }), "magic", false},
		{"layout_0", mod(1, func(b []byte) { b[8] = 0 }), "layout", true},
		{"layout_2", mod(2, func(b []byte) { b[8] = 2 }), "layout", true},
		{"entry_size_32", mod(1, func(b []byte) { b[12] = 32 }), "entry_size", false},
		{"capacity_above_size", mod(2, func(b []byte) { b[16] = 3 }), "capacity", false},
		{"capacity_below_size", mod(2, func(b []byte) { b[16] = 1 }), "capacity", false},
		{"header_only", hex.EncodeToString(good(1)[:TableHeaderSize]), "size", false},
		{"size_not_entries", hex.EncodeToString(append(good(1), make([]byte, 8)...)), "size", false},
	}
}

func TestTableVectors(t *testing.T) {
	cases, invalid := tableCases(t), tableInvalidCases(t)
	if *update {
		f := tableFile{
			Comment: "Generated by `go test ./api/slot/v1 -update`. Each valid vector: an operation (ops), its arguments, the table image before and after it (hex, whole table), and what it returned. Each invalid vector: a table image a reader must refuse, the field it finds wrong, and whether that is another layout version.",
			Ops:     tableOps, Valid: cases, Invalid: invalid,
		}
		out, _ := json.MarshalIndent(f, "", "  ")
		if err := os.WriteFile("testdata/table.json", append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile("testdata/table.json")
	if err != nil {
		t.Fatal(err)
	}
	var file tableFile
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(file.Valid, cases) || !reflect.DeepEqual(file.Invalid, invalid) {
		t.Fatalf("table.json is stale: run go test ./api/slot/v1 -update")
	}
	// Replay from the file alone, as another implementation does.
	for _, v := range file.Valid {
		t.Run(v.Name, func(t *testing.T) {
			var tb *Table
			if v.Before != "" {
				var err error
				if tb, err = NewTable(imageOf(t, v.Before)); err != nil {
					t.Fatal(err)
				}
			}
			tb, res, idx := applyOp(tb, v.Op, v.Args)
			if res != v.Result || idx != v.Index {
				t.Fatalf("got %s index %d, want %s index %d", res, idx, v.Result, v.Index)
			}
			if got := hex.EncodeToString(tb.Bytes()); got != v.After {
				t.Fatalf("after\n got %s\nwant %s", got, v.After)
			}
		})
	}
	for _, v := range file.Invalid {
		t.Run("invalid_"+v.Name, func(t *testing.T) {
			_, err := NewTable(imageOf(t, v.Hex))
			var te *TableError
			if !errors.As(err, &te) || te.Field != v.Error || !errors.Is(err, ErrBadTable) || errors.Is(err, ErrTableLayout) != v.Layout {
				t.Fatalf("got %v, want a %s error (layout %v)", err, v.Error, v.Layout)
			}
		})
	}
}

// TestTableVectorsCover fails when a claim failure the SPEC names has no
// vector.
func TestTableVectorsCover(t *testing.T) {
	seen := map[string]bool{}
	for _, v := range tableCases(t) {
		seen[v.Op+":"+v.Result] = true
	}
	for _, k := range []string{"claim:claimed", "claim:held", "claim:gone", "claim:other_quota", "claim:empty", "control:held", "publish:full", "release:ok", "clear:ok"} {
		if !seen[k] {
			t.Errorf("no vector for %s", k)
		}
	}
}

// TestTableClaimsExclusive: many threads claiming and releasing the same
// few entries never hold one entry twice.
func TestTableClaimsExclusive(t *testing.T) {
	tb, err := FormatTable(alignedBytes(TableSize(4)))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if _, err := tb.Publish(Entry{Slot: uint32(i + 1), QuotaMilli: 250, AskedMilli: 250}, 0, 1); err != nil {
			t.Fatal(err)
		}
	}
	var inUse [4]atomic.Int32
	var wins atomic.Int64
	var wg sync.WaitGroup
	for g := 1; g <= 8; g++ {
		wg.Add(1)
		go func(tid uint32) {
			defer wg.Done()
			for k := 0; k < 20000; k++ {
				i := tb.Find(250, k%4)
				if i < 0 {
					runtime.Gosched()
					continue
				}
				c, r := tb.Claim(i, tid, 250, 2)
				if r != Claimed {
					continue
				}
				if inUse[i].Add(1) != 1 {
					t.Errorf("entry %d held twice", i)
				}
				wins.Add(1)
				inUse[i].Add(-1)
				tb.Release(c, 3)
			}
		}(uint32(g))
	}
	wg.Wait()
	if wins.Load() == 0 {
		t.Fatal("no claim won")
	}
	for i := 0; i < 4; i++ {
		if h := Holder(tb.State(i)); h != 0 {
			t.Errorf("entry %d left held by %d", i, h)
		}
	}
}

func TestCreateTableSealedAndShared(t *testing.T) {
	tb, err := CreateTable(4)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	fd := int(tb.File().Fd())
	if err := unix.Ftruncate(fd, int64(TableSize(8))); err == nil {
		t.Fatal("a created table could grow")
	}
	if err := unix.Ftruncate(fd, int64(TableSize(1))); err == nil {
		t.Fatal("a created table could shrink")
	}
	// A second mapping (as another process maps it) sees the first's writes.
	dup, err := unix.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	other, err := OpenTable(os.NewFile(uintptr(dup), "table"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	c, err := tb.Publish(Entry{Slot: 5, QuotaMilli: 150, AskedMilli: 150, Lease: 8}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := other.Entry(c.Index); got.Slot != 5 || got.Lease != 8 {
		t.Fatalf("other mapping sees %+v", got)
	}
	if _, r := other.Claim(c.Index, 11, 150, 2); r != Claimed {
		t.Fatalf("claim through the other mapping: %s", r)
	}
	if _, r := tb.Claim(c.Index, 12, 150, 2); r != Held {
		t.Fatalf("claim of an entry held through the other mapping: %s", r)
	}
}

func TestOpenTableRefuses(t *testing.T) {
	memfd := func(t *testing.T, size int, seals int, image []byte) *os.File {
		fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "t")
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(image, 0); err != nil {
			t.Fatal(err)
		}
		if seals != 0 {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
				t.Fatal(err)
			}
		}
		return f
	}
	good, _ := FormatTable(alignedBytes(TableSize(2)))
	old := bytes.Clone(good.Bytes())
	old[8] = 0
	for _, c := range []struct {
		name   string
		f      func(t *testing.T) *os.File
		field  string
		layout bool
	}{
		{"unsealed", func(t *testing.T) *os.File { return memfd(t, TableSize(2), 0, good.Bytes()) }, "seals", false},
		{"growable", func(t *testing.T) *os.File {
			return memfd(t, TableSize(2), unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL, good.Bytes())
		}, "seals", false},
		{"old_layout", func(t *testing.T) *os.File { return memfd(t, TableSize(2), tableSeals, old) }, "layout", true},
		{"capacity_past_size", func(t *testing.T) *os.File { return memfd(t, TableSize(1), tableSeals, good.Bytes()[:TableSize(1)]) }, "capacity", false},
		{"plain_file", func(t *testing.T) *os.File {
			p := t.TempDir() + "/table"
			if err := os.WriteFile(p, good.Bytes(), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}, "seals", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := OpenTable(c.f(t))
			var te *TableError
			if !errors.As(err, &te) || te.Field != c.field || errors.Is(err, ErrTableLayout) != c.layout {
				t.Fatalf("got %v, want a %s error", err, c.field)
			}
		})
	}
}

// TestTableSharedWithChild: a child process given the memfd claims an
// entry the parent then sees held, and releases it.
func TestTableSharedWithChild(t *testing.T) {
	if os.Getenv("SLOTV1_TABLE_CHILD") == "1" {
		tb, err := OpenTable(os.NewFile(3, "table"))
		if err != nil {
			os.Exit(2)
		}
		if _, r := tb.Claim(0, uint32(unix.Gettid()), 250, 5); r != Claimed {
			os.Exit(3)
		}
		os.Stdout.Write([]byte("claimed\n"))
		var b [1]byte
		os.Stdin.Read(b[:]) // until the parent has looked
		tb.Release(Claim{Index: 0, State: tb.State(0)}, 6)
		os.Exit(0)
	}
	tb, err := CreateTable(2)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	if _, err := tb.Publish(Entry{Slot: 3, QuotaMilli: 250, AskedMilli: 250}, 0, 1); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestTableSharedWithChild$")
	cmd.Env = append(os.Environ(), "SLOTV1_TABLE_CHILD=1")
	cmd.ExtraFiles = []*os.File{tb.File()}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 8)
	if _, err := out.Read(line); err != nil || string(line) != "claimed\n" {
		in.Close()
		t.Fatalf("child: %q %v (exit %v)", line, err, cmd.Wait())
	}
	if h := Holder(tb.State(0)); h == 0 || h == HolderControl {
		t.Errorf("parent sees holder %d after the child's claim", h)
	}
	if _, r := tb.Claim(0, 1, 250, 5); r != Held {
		t.Errorf("parent claimed the child's entry: %s", r)
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	if e := tb.Entry(0); Holder(e.State) != 0 || e.IdleSince != 6 {
		t.Fatalf("after the child's release: %+v", e)
	}
}
