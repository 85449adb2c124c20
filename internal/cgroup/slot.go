package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/counters"
)

// Limit is how a slot limits CPU: a hard cap, a proportional share, or both.
type Limit uint8

const (
	// LimitCap caps CPU time per period (cpu.max / cpu.cfs_quota_us).
	LimitCap Limit = 1 << iota
	// LimitShare sets a weight in proportion to the quota
	// (cpu.weight / cpu.shares): a work-conserving minimum.
	LimitShare
	LimitBoth = LimitCap | LimitShare
)

// ParseLimit reads "cap", "share" or "both".
func ParseLimit(s string) (Limit, error) {
	switch s {
	case "cap":
		return LimitCap, nil
	case "share":
		return LimitShare, nil
	case "both":
		return LimitBoth, nil
	}
	return 0, fmt.Errorf("limit %q: want cap, share or both", s)
}

func (l Limit) String() string {
	switch l {
	case LimitCap:
		return "cap"
	case LimitShare:
		return "share"
	case LimitBoth:
		return "both"
	}
	return fmt.Sprintf("limit(%d)", uint8(l))
}

// Spec is what a slot enforces.
type Spec struct {
	QuotaMilli uint32
	PeriodUS   uint32
	Limit      Limit
}

// DefaultPeriodUS is the kernel's default CFS period.
const DefaultPeriodUS = 100000

// MinQuotaUS is the smallest quota the kernel accepts per period.
const MinQuotaUS = 1000

// QuotaUS is the CPU time per period the quota allows.
func (s Spec) QuotaUS() int64 { return int64(s.QuotaMilli) * int64(s.PeriodUS) / 1000 }

// Validate checks a spec against the kernel's bounds.
func (s Spec) Validate() error {
	if s.QuotaMilli == 0 {
		return errors.New("quota must be positive")
	}
	if s.PeriodUS < 1000 || s.PeriodUS > 1000000 {
		return fmt.Errorf("period %dus outside 1ms..1s", s.PeriodUS)
	}
	if s.QuotaUS() < MinQuotaUS {
		return fmt.Errorf("quota %dm is below the kernel minimum of %dus per %dus period", s.QuotaMilli, MinQuotaUS, s.PeriodUS)
	}
	if s.Limit&LimitBoth == 0 {
		return errors.New("limit must be cap, share or both")
	}
	return nil
}

func clamp(v, lo, hi int64) int64 { return min(max(v, lo), hi) }

// Usage is what a slot has consumed since it was made (defined in the
// public counters package, which the client shares).
type Usage = counters.Usage

// Slot is one CPU cgroup inside a container. Its files are opened relative
// to the container's directory fds. A slot in use keeps them open while the
// node-wide budget of kept fds (Hierarchy.SetKeptFDs) allows: the hot path
// then makes no open; beyond the budget they are opened per use, so no
// number of slots exhausts the agent's fds.
type Slot struct {
	ID   uint32
	c    *Container
	name string
	spec Spec

	mu   sync.Mutex
	kept *slotFiles // nil: not kept open
}

// slotFiles are a slot's open files: placement fds, cpu.stat, and on v1
// cpuacct.usage (-1 on v2).
type slotFiles struct {
	place      []int
	stat, acct int
}

func (f *slotFiles) count() int {
	n := len(f.place) + 1
	if f.acct >= 0 {
		n++
	}
	return n
}

func (f *slotFiles) close() {
	closeFDs(f.place)
	unix.Close(f.stat)
	if f.acct >= 0 {
		unix.Close(f.acct)
	}
}

// fdBudget is the budget of fds the slots of a hierarchy's containers keep
// open: the node's, as the agent has one Hierarchy.
type fdBudget struct{ limit, used atomic.Int64 }

// DefaultKeptFDs is the budget of fds slots keep open until SetKeptFDs.
const DefaultKeptFDs = 4096

// SetKeptFDs sets the budget of fds the slots of the hierarchy's
// containers keep open (the agent gives half its RLIMIT_NOFILE; 0:
// DefaultKeptFDs). Call it before any slot is used.
func (h *Hierarchy) SetKeptFDs(n int) { h.kept.limit.Store(int64(n)) }

// take reserves n fds of the budget, or reports that they do not fit.
func (b *fdBudget) take(n int64) bool {
	limit := b.limit.Load()
	if limit <= 0 {
		limit = DefaultKeptFDs
	}
	if b.used.Add(n) <= limit {
		return true
	}
	b.used.Add(-n)
	return false
}

// use runs f with the slot's files open, keeping them open when the budget
// allows.
func (s *Slot) use(f func(*slotFiles) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kept != nil {
		return f(s.kept)
	}
	files, err := s.open()
	if err != nil {
		return err
	}
	if s.c.h.kept.take(int64(files.count())) {
		s.kept = files
	} else {
		defer files.close()
	}
	return f(files)
}

func (s *Slot) open() (*slotFiles, error) {
	files := &slotFiles{stat: -1, acct: -1}
	for i := range s.c.dirs {
		fd, err := s.c.openAt(i, s.name+"/"+s.c.h.ThreadsFile(), unix.O_WRONLY)
		if err != nil {
			closeFDs(files.place)
			return nil, s.c.gone(err)
		}
		files.place = append(files.place, fd)
	}
	var err error
	if files.stat, files.acct, err = s.openCounters(); err != nil {
		closeFDs(files.place)
		return nil, s.c.gone(err)
	}
	return files, nil
}

// forget closes the files the slot keeps open and returns their budget.
func (s *Slot) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kept != nil {
		s.c.h.kept.used.Add(-int64(s.kept.count()))
		s.kept.close()
		s.kept = nil
	}
}

func (c *Container) slot(id uint32) *Slot { return &Slot{ID: id, c: c, name: SlotName(id)} }

// Name is the slot's directory name.
func (s *Slot) Name() string { return s.name }

// Dir is the slot's directory in the cpu hierarchy (for messages).
func (s *Slot) Dir() string { return filepath.Join(s.c.dirs[0], s.name) }

// Spec is what the slot currently enforces.
func (s *Slot) Spec() Spec { return s.spec }

// OpenFDs opens the fds to hand to a client: the placement fds (writing "0"
// to each moves the writing thread into the slot), then read-only fds of the
// counters (cpu.stat, then on v1 cpuacct.usage). The caller closes them.
func (s *Slot) OpenFDs() ([]int, error) {
	var fds []int
	fail := func(err error) ([]int, error) {
		closeFDs(fds)
		return nil, s.c.gone(err)
	}
	for i := range s.c.dirs {
		fd, err := s.c.openAt(i, s.name+"/"+s.c.h.ThreadsFile(), unix.O_WRONLY)
		if err != nil {
			return fail(err)
		}
		fds = append(fds, fd)
	}
	stat, acct, err := s.openCounters()
	if err != nil {
		return fail(err)
	}
	fds = append(fds, stat)
	if acct >= 0 {
		fds = append(fds, acct)
	}
	return fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// openCounters opens cpu.stat and (v1) cpuacct.usage; acct is -1 on v2.
func (s *Slot) openCounters() (stat, acct int, err error) {
	stat, err = s.c.openAt(0, s.name+"/cpu.stat", unix.O_RDONLY)
	if err != nil {
		return -1, -1, err
	}
	if acct, err = s.c.h.v.openAcct(s); err != nil {
		unix.Close(stat)
		return -1, -1, err
	}
	return stat, acct, nil
}

var self = []byte("0")

// Place moves thread tid (in the agent's PID namespace; 0 = the calling
// thread) into the slot, in every hierarchy the slot spans.
func (s *Slot) Place(tid int) error {
	start := time.Now()
	b := self
	if tid != 0 {
		b = strconv.AppendInt(make([]byte, 0, 12), int64(tid), 10)
	}
	err := s.use(func(f *slotFiles) error {
		for _, fd := range f.place {
			if _, err := unix.Write(fd, b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		err = s.c.gone(fmt.Errorf("placing thread %d in %s: %w", tid, s.Name(), err))
	}
	s.c.observe(OpPlace, time.Since(start), err)
	return err
}

// Retune changes what the slot enforces, writing only what differs.
func (s *Slot) Retune(spec Spec) error { return s.apply(spec, false) }

func (s *Slot) apply(spec Spec, fresh bool) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if !fresh && spec == s.spec {
		return nil
	}
	start := time.Now()
	err := s.write(spec, fresh)
	s.c.observe(OpSetQuota, time.Since(start), err)
	if err != nil {
		return s.c.gone(fmt.Errorf("setting %dm on %s: %w", spec.QuotaMilli, s.Name(), err))
	}
	s.spec = spec
	return nil
}

func (s *Slot) write(spec Spec, fresh bool) error { return s.c.h.v.writeSpec(s, spec, fresh) }

func (s *Slot) writeFile(name, value string) error { return s.c.writeAt(0, s.name+"/"+name, value) }

// readSpec reads back what an adopted slot enforces. A slot that limits
// nothing (made but never configured) is marked by a zero quota; the pool
// retunes or removes it.
func (s *Slot) readSpec() (Spec, error) { return s.c.h.v.readSpec(s) }

func (s *Slot) readInt(name string) (int64, error) {
	b, err := s.c.readAt(0, s.name+"/"+name)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// Usage reads the slot's counters.
func (s *Slot) Usage() (Usage, error) {
	start := time.Now()
	u, err := s.readUsage()
	s.c.observe(OpReadStat, time.Since(start), err)
	return u, err
}

func (s *Slot) readUsage() (Usage, error) {
	var u Usage
	err := s.use(func(f *slotFiles) (err error) {
		u, err = counters.Read(f.stat, f.acct)
		return err
	})
	if err != nil {
		return Usage{}, s.c.gone(fmt.Errorf("reading counters of %s: %w", s.Name(), err))
	}
	return u, nil
}

// Threads lists the threads in the slot (TIDs in the agent's PID namespace);
// an error wrapping os.ErrNotExist when the slot is gone from every
// hierarchy.
func (s *Slot) Threads() ([]int, error) {
	seen := map[int]bool{}
	var tids []int
	gone := 0
	for i := range s.c.dirs {
		lines, err := s.c.linesAt(i, s.name+"/"+s.c.h.ThreadsFile())
		if errors.Is(err, os.ErrNotExist) {
			// Half removed (v1, hierarchies apart): the threads are those
			// of the directories left.
			gone++
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, l := range lines {
			if t, err := strconv.Atoi(l); err == nil && !seen[t] {
				seen[t] = true
				tids = append(tids, t)
			}
		}
	}
	if gone == len(s.c.dirs) {
		return nil, fmt.Errorf("slot %s: %w", s.name, os.ErrNotExist)
	}
	return tids, nil
}

// Remove moves any thread left in the slot back to the container and
// deletes the slot's directories. Threads that keep arriving (an invocation
// spawning threads) are retried a few times before ErrBusy; a cgroup made
// inside the slot is a *ChildCgroupError at once.
func (s *Slot) Remove() error {
	s.forget()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * time.Millisecond)
		}
		var tids []int
		if tids, err = s.Threads(); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil // already gone
			}
			continue
		}
		for _, t := range tids {
			// A thread that exited meanwhile gives ESRCH: nothing to move.
			if merr := s.c.MoveOut(t); merr != nil && !errors.Is(merr, syscall.ESRCH) && !errors.Is(merr, ErrNotInSlot) {
				err = merr
			}
		}
		if err = s.rmdir(); err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return err
		}
		if child := s.child(); child != "" {
			return &ChildCgroupError{Slot: s.Name(), Child: child}
		}
	}
	return fmt.Errorf("removing %s: %w: %w", s.Name(), ErrBusy, err)
}

// child names a cgroup inside the slot, in any hierarchy ("" if none).
func (s *Slot) child() string {
	for i := range s.c.dirs {
		if names, err := s.c.subdirsOf(i, s.name); err == nil && len(names) > 0 {
			return names[0]
		}
	}
	return ""
}

func (s *Slot) rmdir() error {
	start := time.Now()
	var err error
	for i := len(s.c.dirs) - 1; i >= 0; i-- {
		if rerr := s.c.rmdirAt(i, s.name); rerr != nil && !errors.Is(rerr, syscall.ENOENT) {
			err = rerr
			break
		}
	}
	s.c.observe(OpRmdir, time.Since(start), err)
	return err
}

// Close forgets the slot and leaves the cgroup in place (agent shutdown:
// running invocations keep their slots, the next agent adopts them).
func (s *Slot) Close() { s.forget() }
