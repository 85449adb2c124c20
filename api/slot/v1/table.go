package slotv1

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The slot table (SPEC.md, "Slot table layout, version 1"): the client's
// record of the slots its process holds, in shared memory so that a thread
// claims one with a compare-and-swap and gives it back with a store.
const (
	TableMagic      = "cpuslotT"
	TableLayout     = 1
	TableHeaderSize = 64
	TableEntrySize  = 64
	MaxTableEntries = 1024

	// HolderControl is the holder of an entry the process is publishing,
	// re-declaring or dropping.
	HolderControl = 0xFFFFFFFF

	// Entry flags.
	EntryDegraded = 1 << 0
	EntryGone     = 1 << 1
)

// Byte offsets in the header and in an entry.
const (
	offMagic     = 0
	offLayout    = 8
	offEntrySize = 12
	offCapacity  = 16

	offState     = 0
	offSlot      = 8
	offQuota     = 12
	offPeriod    = 16
	offFlags     = 20
	offLease     = 24
	offAsked     = 32
	offIdleSince = 40
)

// ErrBadTable is what every refused table matches with errors.Is;
// ErrTableLayout is what a table of another layout version (an older or
// newer client) matches in addition.
var (
	ErrBadTable    = errors.New("not a usable slot table")
	ErrTableLayout = errors.New("slot table of another layout version")
	// ErrTableFull is Publish's error when no entry is empty.
	ErrTableFull = errors.New("slot table full")
)

// TableError says which field of a table was refused.
type TableError struct {
	Field     string
	Got, Want uint64
	Err       error // ErrBadTable or ErrTableLayout
}

func (e *TableError) Error() string {
	return fmt.Sprintf("%v: %s is %d, want %d", e.Err, e.Field, e.Got, e.Want)
}

// Unwrap lets errors.Is match ErrTableLayout and ErrBadTable.
func (e *TableError) Unwrap() []error {
	if e.Err == ErrTableLayout {
		return []error{ErrTableLayout, ErrBadTable}
	}
	return []error{e.Err}
}

// TableSize is the byte size of a table of capacity entries.
func TableSize(capacity int) int { return TableHeaderSize + TableEntrySize*capacity }

// Entry is a snapshot of one entry.
type Entry struct {
	State      uint64
	Slot       uint32
	QuotaMilli uint32
	PeriodUS   uint32
	Flags      uint32
	Lease      uint64
	AskedMilli uint32
	IdleSince  uint64 // CLOCK_MONOTONIC ns at the last release
}

// Holder is the holder half of a state word (0: free).
func Holder(state uint64) uint32 { return uint32(state) }

// Generation is the generation half of a state word.
func Generation(state uint64) uint32 { return uint32(state >> 32) }

// ClaimResult says how a claim ended.
type ClaimResult uint8

const (
	Claimed    ClaimResult = iota
	Held                   // another holder has the entry
	Lost                   // another claim won the compare-and-swap
	Empty                  // the entry holds no slot
	Gone                   // the agent no longer backs the slot
	OtherQuota             // the entry was asked for another quota
	BadIndex               // no such entry, or holder 0
)

var claimNames = [...]string{"claimed", "held", "lost", "empty", "gone", "other_quota", "bad_index"}

func (r ClaimResult) String() string {
	if int(r) < len(claimNames) {
		return claimNames[r]
	}
	return fmt.Sprintf("claim_%d", uint8(r))
}

// Claim is an entry held by the caller: its index and the state word the
// claim wrote, which Release needs.
type Claim struct {
	Index int
	State uint64
}

// Table is a slot table over memory the caller keeps alive: a shared
// mapping of a memfd (CreateTable, OpenTable) or any 8-aligned []byte
// (NewTable, FormatTable; tests and vectors).
type Table struct {
	mem  []byte
	n    int
	file *os.File // nil over plain memory
}

var littleEndian = func() bool { x := uint16(1); return *(*byte)(unsafe.Pointer(&x)) == 1 }()

// The layout is little-endian; every field is accessed atomically, so a
// reader never sees a torn value whatever other threads (or a scribbling
// invocation) write.
func (t *Table) p64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&t.mem[off])) }
func (t *Table) p32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&t.mem[off])) }

func le64(v uint64) uint64 {
	if littleEndian {
		return v
	}
	return bits.ReverseBytes64(v)
}

func le32(v uint32) uint32 {
	if littleEndian {
		return v
	}
	return bits.ReverseBytes32(v)
}

func (t *Table) load64(off int) uint64     { return le64(atomic.LoadUint64(t.p64(off))) }
func (t *Table) store64(off int, v uint64) { atomic.StoreUint64(t.p64(off), le64(v)) }
func (t *Table) load32(off int) uint32     { return le32(atomic.LoadUint32(t.p32(off))) }
func (t *Table) store32(off int, v uint32) { atomic.StoreUint32(t.p32(off), le32(v)) }
func (t *Table) cas(off int, old, new uint64) bool {
	return atomic.CompareAndSwapUint64(t.p64(off), le64(old), le64(new))
}

func entryOff(i int) int { return TableHeaderSize + TableEntrySize*i }

func checkMem(mem []byte) error {
	if len(mem) < TableSize(1) || len(mem) > TableSize(MaxTableEntries) || len(mem)%TableEntrySize != 0 {
		return &TableError{Field: "size", Got: uint64(len(mem)), Want: uint64(TableSize(1)), Err: ErrBadTable}
	}
	if uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return &TableError{Field: "alignment", Got: uint64(uintptr(unsafe.Pointer(&mem[0])) % 8), Want: 0, Err: ErrBadTable}
	}
	return nil
}

// FormatTable writes an empty table of len(mem)/64 - 1 entries over mem.
func FormatTable(mem []byte) (*Table, error) {
	if err := checkMem(mem); err != nil {
		return nil, err
	}
	clear(mem)
	copy(mem[offMagic:], TableMagic)
	t := &Table{mem: mem, n: (len(mem) - TableHeaderSize) / TableEntrySize}
	t.store32(offLayout, TableLayout)
	t.store32(offEntrySize, TableEntrySize)
	t.store32(offCapacity, uint32(t.n))
	return t, nil
}

// NewTable validates a table image and uses it in place.
func NewTable(mem []byte) (*Table, error) {
	if err := checkMem(mem); err != nil {
		return nil, err
	}
	t := &Table{mem: mem, n: (len(mem) - TableHeaderSize) / TableEntrySize}
	if string(mem[offMagic:offMagic+8]) != TableMagic {
		return nil, &TableError{Field: "magic", Got: binary.LittleEndian.Uint64(mem), Want: binary.LittleEndian.Uint64([]byte(TableMagic)), Err: ErrBadTable}
	}
	if v := t.load32(offLayout); v != TableLayout {
		return nil, &TableError{Field: "layout", Got: uint64(v), Want: TableLayout, Err: ErrTableLayout}
	}
	if v := t.load32(offEntrySize); v != TableEntrySize {
		return nil, &TableError{Field: "entry_size", Got: uint64(v), Want: TableEntrySize, Err: ErrBadTable}
	}
	if v := t.load32(offCapacity); v != uint32(t.n) {
		return nil, &TableError{Field: "capacity", Got: uint64(v), Want: uint64(t.n), Err: ErrBadTable}
	}
	return t, nil
}

const tableSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// CreateTable makes a sealed memfd of capacity entries, maps it shared and
// formats it. File gives the memfd to share with a child process.
func CreateTable(capacity int) (*Table, error) {
	if capacity < 1 || capacity > MaxTableEntries {
		return nil, fmt.Errorf("slot table capacity %d: want 1..%d", capacity, MaxTableEntries)
	}
	fd, err := unix.MemfdCreate("cpuslot-table", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "cpuslot-table")
	size := TableSize(capacity)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("ftruncate slot table: %w", err)
	}
	// Sealed before it is mapped: no mapping of it can fault past its end.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, tableSeals); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal slot table: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("mmap slot table: %w", err)
	}
	t, err := FormatTable(mem)
	if err != nil {
		unix.Munmap(mem)
		f.Close()
		return nil, err
	}
	t.file = f
	return t, nil
}

// OpenTable maps a table another process of the container created (a memfd
// it passed down) after checking its seals and size, and validates it. The
// Table owns f from then on, also when OpenTable fails.
func OpenTable(f *os.File) (*Table, error) {
	fail := func(err error) (*Table, error) { f.Close(); return nil, err }
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return fail(&TableError{Field: "seals", Got: 0, Want: tableSeals, Err: ErrBadTable})
	}
	if seals&tableSeals != tableSeals {
		return fail(&TableError{Field: "seals", Got: uint64(seals), Want: tableSeals, Err: ErrBadTable})
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fail(fmt.Errorf("fstat slot table: %w", err))
	}
	if st.Size < int64(TableSize(1)) || st.Size > int64(TableSize(MaxTableEntries)) || st.Size%TableEntrySize != 0 {
		return fail(&TableError{Field: "size", Got: uint64(st.Size), Want: uint64(TableSize(1)), Err: ErrBadTable})
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("mmap slot table: %w", err))
	}
	t, err := NewTable(mem)
	if err != nil {
		unix.Munmap(mem)
		return fail(err)
	}
	t.file = f
	return t, nil
}

// File is the table's memfd (nil over plain memory).
func (t *Table) File() *os.File { return t.file }

// Close unmaps a memfd table and closes its fd. No operation may follow.
func (t *Table) Close() error {
	if t.file == nil {
		return nil
	}
	err := unix.Munmap(t.mem)
	if cerr := t.file.Close(); err == nil {
		err = cerr
	}
	t.file, t.mem = nil, nil
	return err
}

// Cap is the number of entries.
func (t *Table) Cap() int { return t.n }

// Bytes is the table's memory (for tests and vectors).
func (t *Table) Bytes() []byte { return t.mem }

// State loads entry i's state word.
func (t *Table) State(i int) uint64 { return t.load64(entryOff(i) + offState) }

// Entry reads a snapshot of entry i, field by field (not atomically as a
// whole: a caller that must trust it claims the entry first).
func (t *Table) Entry(i int) Entry {
	o := entryOff(i)
	return Entry{
		State:      t.load64(o + offState),
		Slot:       t.load32(o + offSlot),
		QuotaMilli: t.load32(o + offQuota),
		PeriodUS:   t.load32(o + offPeriod),
		Flags:      t.load32(o + offFlags),
		Lease:      t.load64(o + offLease),
		AskedMilli: t.load32(o + offAsked),
		IdleSince:  t.load64(o + offIdleSince),
	}
}

// take compare-and-swaps a free entry to holder, bumping its generation.
func (t *Table) take(i int, holder uint32) (Claim, ClaimResult) {
	if i < 0 || i >= t.n || holder == 0 {
		return Claim{}, BadIndex
	}
	o := entryOff(i)
	s := t.load64(o + offState)
	if Holder(s) != 0 {
		return Claim{}, Held
	}
	ns := uint64(Generation(s)+1)<<32 | uint64(holder)
	if !t.cas(o+offState, s, ns) {
		return Claim{}, Lost
	}
	return Claim{Index: i, State: ns}, Claimed
}

// Claim takes entry i for thread tid if it is free, holds a slot, is not
// GONE and was asked for quota askedM. A claim that fails after winning the
// compare-and-swap releases the entry again (stamping now).
func (t *Table) Claim(i int, tid, askedM uint32, now uint64) (Claim, ClaimResult) {
	if tid == HolderControl {
		return Claim{}, BadIndex
	}
	c, r := t.take(i, tid)
	if r != Claimed {
		return c, r
	}
	o := entryOff(i)
	switch {
	case t.load32(o+offSlot) == 0:
		r = Empty
	case t.load32(o+offFlags)&EntryGone != 0:
		r = Gone
	case t.load32(o+offAsked) != askedM:
		r = OtherQuota
	default:
		return c, Claimed
	}
	t.Release(c, now)
	return Claim{}, r
}

// Release gives a claimed entry back: idle_since, then the state word with
// the claim's generation and no holder.
func (t *Table) Release(c Claim, now uint64) {
	o := entryOff(c.Index)
	t.store64(o+offIdleSince, now)
	t.store64(o+offState, uint64(Generation(c.State))<<32)
}

// Control takes entry i with holder CONTROL, whatever it holds, to
// re-declare or drop it.
func (t *Table) Control(i int) (Claim, ClaimResult) { return t.take(i, HolderControl) }

// Clear zeroes every field of a CONTROL-held entry but its state, then
// releases it: the entry is empty (drop, after its lease was released).
func (t *Table) Clear(c Claim, now uint64) {
	o := entryOff(c.Index)
	for off := o + offSlot; off < o+TableEntrySize; off += 8 {
		t.store64(off, 0)
	}
	t.Release(c, now)
}

// Find returns the first entry at or after from (wrapping around) that is
// free, holds a slot, is not GONE and was asked for askedM; -1 if none. It
// only looks: Claim decides.
func (t *Table) Find(askedM uint32, from int) int {
	if from < 0 || from >= t.n {
		from = 0
	}
	for k := 0; k < t.n; k++ {
		i := from + k
		if i >= t.n {
			i -= t.n
		}
		if t.Match(i, askedM) {
			return i
		}
	}
	return -1
}

// Match reports whether entry i looks claimable for askedM: free, holding
// a slot, not GONE, asked for askedM. It only looks: Claim decides.
func (t *Table) Match(i int, askedM uint32) bool {
	o := entryOff(i)
	return t.load32(o+offAsked) == askedM && Holder(t.load64(o+offState)) == 0 &&
		t.load32(o+offSlot) != 0 && t.load32(o+offFlags)&EntryGone == 0
}

// Publish writes a granted HOLD lease into the first empty entry: claimed
// with holder CONTROL, fields written (idle_since = now), then handed to
// holder (a thread's TID, to use it at once) or left free (holder 0).
func (t *Table) Publish(e Entry, holder uint32, now uint64) (Claim, error) {
	if holder == HolderControl {
		return Claim{}, errors.New("publish: holder CONTROL")
	}
	for i := 0; i < t.n; i++ {
		o := entryOff(i)
		if t.load32(o+offSlot) != 0 || Holder(t.load64(o+offState)) != 0 {
			continue
		}
		c, r := t.take(i, HolderControl)
		if r != Claimed {
			continue
		}
		if t.load32(o+offSlot) != 0 {
			t.Release(c, now)
			continue
		}
		t.store32(o+offQuota, e.QuotaMilli)
		t.store32(o+offPeriod, e.PeriodUS)
		t.store32(o+offFlags, e.Flags)
		t.store64(o+offLease, e.Lease)
		t.store32(o+offAsked, e.AskedMilli)
		t.store64(o+offIdleSince, now)
		t.store32(o+offSlot, e.Slot)
		c.State = uint64(Generation(c.State))<<32 | uint64(holder)
		t.store64(o+offState, c.State)
		return c, nil
	}
	return Claim{}, ErrTableFull
}

// SetLease writes the lease id of entry i (after a RECLAIM gave it a new one).
func (t *Table) SetLease(i int, lease uint64) { t.store64(entryOff(i)+offLease, lease) }

// FreeDead frees entry i, which the caller read as state s, held by a
// thread that no longer exists (the caller checked): idle_since, then the
// state word with the next generation and no holder, by compare-and-swap
// from s so that a claim since (a new generation) is left alone. False when
// s does not name a thread's claim or the state changed.
func (t *Table) FreeDead(i int, s uint64, now uint64) bool {
	if h := Holder(s); h == 0 || h == HolderControl || i < 0 || i >= t.n {
		return false
	}
	o := entryOff(i)
	if t.load64(o+offState) != s {
		return false
	}
	t.store64(o+offIdleSince, now)
	return t.cas(o+offState, s, uint64(Generation(s)+1)<<32)
}

// SetGranted writes what the agent grants entry i's lease now: its quota,
// and the DEGRADED flag set or cleared (a degraded lease raised later).
func (t *Table) SetGranted(i int, quotaM uint32, degraded bool) {
	o := entryOff(i)
	t.store32(o+offQuota, quotaM)
	p := t.p32(o + offFlags)
	if degraded {
		atomic.OrUint32(p, le32(EntryDegraded))
	} else {
		atomic.AndUint32(p, ^le32(EntryDegraded))
	}
}

// MarkGone sets entry i's GONE flag: its slot is no longer backed; claims
// fail from now on, and the entry is dropped once free.
func (t *Table) MarkGone(i int) {
	p := t.p32(entryOff(i) + offFlags)
	atomic.OrUint32(p, le32(EntryGone))
}
