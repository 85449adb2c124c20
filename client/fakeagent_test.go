package client_test

// A fake agent for unit tests of the client's logic (local leasing, usage
// batching, reconnects) that need no cgroups: it speaks the slot protocol
// on a Unix socket and passes, as a slot's fds, a pipe (so it can count the
// client's placement writes) and a memfd holding cpu.stat text (so it can
// say what the slot used). The agent's real behaviour is tested in
// internal/agent against the kernel.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

type fakeSlot struct {
	id       uint32
	quota    uint32
	placeR   *os.File
	placeW   *os.File
	stat     *os.File
	writes   atomic.Int64
	cpuUsec  atomic.Uint64
	leasedTo uint64 // lease id, 0 = free
	// given: the slot's fds went to some connection.
	given bool
}

type fakeAgent struct {
	t     testing.TB
	path  string
	local bool // grant LOCAL to clients that ask

	mu        sync.Mutex
	ln        *net.UnixListener
	conns     map[*net.UnixConn]bool
	accepted  []*net.UnixConn // in the order they came
	slots     map[uint32]*fakeSlot
	leases    map[uint64]uint32 // lease -> slot
	nextLease uint64
	requests  map[string]int
	usage     []slotv1.Usage
	released  []uint64
	reclaims  []slotv1.Reclaim
	// unknownReleases counts RELEASEs of lease ids the fake never granted
	// (or had released already).
	unknownReleases int
	hellos          []uint32 // HELLO flags
	// refuseReclaim answers RECLAIM with UNKNOWN_LEASE.
	refuseReclaim bool
	// budget, when set, rejects a HOLD that does not fit beside the
	// quotas leased (admission policy reject); sayBudget announces it in
	// HELLO_OK.
	budget    uint32
	sayBudget bool
	// queue makes an over-budget HOLD or ACQUIRE wait (admission policy
	// queue) until it fits or its wait_us passes (TIMEOUT), instead of
	// REJECTED.
	queue bool
	// holdList answers HOLD_LIST (and says so in HELLO_OK): the budget, the leased
	// quota above it as what to give back, and each HOLD lease with its
	// quota (granted overrides it) and degraded flag.
	holdList bool
	granted  map[uint64]uint32
	degraded map[uint64]bool
	// notGrant answers ACQUIRE with RELEASE_OK and slot 1's fds: no grant.
	notGrant bool
	// errorFDs answers ACQUIRE with an ERROR that carries slot 1's fds.
	errorFDs bool
	// lend announces LEND in HELLO_OK; sleepWakes records each SLEEP and WAKE
	// ("sleep 101"), which release nothing.
	lend       bool
	sleepWakes []string
	// refuseSleep answers SLEEP REJECTED, as an agent does past its rate.
	refuseSleep bool
	// holdGate, when set, holds every HOLD request until it is closed (a
	// grant that arrives late).
	holdGate chan struct{}
	// holdDelay delays the answer to every HOLD request (a round trip on
	// a busy node).
	holdDelay time.Duration
	// acquireGate, when set, holds every ACQUIRE of a thread's own lease
	// until it is closed; waitUS is the wait budget of the last ACQUIRE.
	acquireGate chan struct{}
	waitUS      uint32
	// helloGate, when set, holds every HELLO until it is closed (a
	// reconnect under way).
	helloGate chan struct{}
	// ownSlots grants a slot whose fds went to one connection to that
	// connection only, so that a slot seen by two processes over a whole
	// run means one of them used a slot it holds no fds for.
	ownSlots bool
}

// setHoldList turns HOLD_LIST on while the fake serves: under its lock, because a
// connection's goroutine reads it (the race detector sees no order
// through the socket).
func (f *fakeAgent) setHoldList() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holdList = true
}

func newFakeAgent(t testing.TB, local bool) *fakeAgent {
	f := &fakeAgent{t: t, path: filepath.Join(t.TempDir(), "agent.sock"), local: local, slots: map[uint32]*fakeSlot{},
		leases: map[uint64]uint32{}, nextLease: 100, requests: map[string]int{}}
	f.listen()
	t.Cleanup(func() {
		f.stop()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, s := range f.slots {
			s.placeR.Close()
			s.placeW.Close()
			s.stat.Close()
		}
	})
	return f
}

func (f *fakeAgent) listen() {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: f.path, Net: "unix"})
	if err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.ln, f.conns = ln, map[*net.UnixConn]bool{}
	f.mu.Unlock()
	go func() {
		for {
			cn, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns[cn] = true
			f.accepted = append(f.accepted, cn)
			f.mu.Unlock()
			go f.serve(cn)
		}
	}()
}

// stop closes the socket and every connection, as a killed agent does;
// slots and their fds live on.
func (f *fakeAgent) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ln == nil {
		return
	}
	f.ln.Close()
	os.Remove(f.path)
	for cn := range f.conns {
		cn.Close()
	}
	f.ln, f.conns = nil, nil
}

// hangUp closes the i-th connection accepted (from 0), as an agent does to
// one connection; the agent lives on.
func (f *fakeAgent) hangUp(i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.accepted[i].Close()
}

// restart is a new agent on the same socket: it adopts the slots, knows no
// lease (clients re-declare theirs).
func (f *fakeAgent) restart() {
	f.stop()
	f.mu.Lock()
	f.leases = map[uint64]uint32{}
	for _, s := range f.slots {
		s.leasedTo = 0
	}
	f.mu.Unlock()
	f.listen()
}

func (f *fakeAgent) count(what string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[what]
}

func (f *fakeAgent) helloFlags() uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hellos[0]
}

// writes is the number of placement writes into every slot.
func (f *fakeAgent) writes() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for _, s := range f.slots {
		n += s.writes.Load()
	}
	return n
}

// burn makes slot id's counters say it used d more CPU.
func (f *fakeAgent) burn(id uint32, d time.Duration) {
	f.mu.Lock()
	s := f.slots[id]
	f.mu.Unlock()
	u := s.cpuUsec.Add(uint64(d.Microseconds()))
	// Fixed width: a reader never sees a half-written number.
	s.stat.WriteAt([]byte(fmt.Sprintf("usage_usec %020d\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n", u)), 0)
}

func (f *fakeAgent) usageRecords() []slotv1.UsageRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []slotv1.UsageRecord
	for _, u := range f.usage {
		out = append(out, u.Records...)
	}
	return out
}

func (f *fakeAgent) newSlot(quota uint32) *fakeSlot {
	r, w, err := os.Pipe()
	if err != nil {
		f.t.Error(err)
		return nil
	}
	fd, err := unix.MemfdCreate("cpu.stat", unix.MFD_CLOEXEC)
	if err != nil {
		f.t.Error(err)
		return nil
	}
	s := &fakeSlot{id: uint32(len(f.slots) + 1), quota: quota, placeR: r, placeW: w, stat: os.NewFile(uintptr(fd), "cpu.stat")}
	s.stat.WriteAt([]byte(fmt.Sprintf("usage_usec %020d\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n", 0)), 0)
	f.slots[s.id] = s
	go func() {
		b := make([]byte, 64)
		for {
			n, err := r.Read(b)
			s.writes.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	return s
}

func (f *fakeAgent) serve(cn *net.UnixConn) {
	defer cn.Close()
	sent := map[uint32]bool{} // slots whose fds this connection got
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(cn, hdr[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(cn, body); err != nil {
			return
		}
		fr, err := slotv1.DecodeBody(body)
		if err != nil {
			f.reply(cn, 0, &slotv1.Error{Code: slotv1.CodeBadRequest, Message: err.Error()}, nil)
			return
		}
		if _, ok := fr.Msg.(*slotv1.Hello); ok {
			f.mu.Lock()
			gate := f.helloGate
			if gate != nil {
				f.requests["hello gated"]++
			}
			f.mu.Unlock()
			if gate != nil {
				<-gate
			}
		}
		if a, ok := fr.Msg.(*slotv1.Acquire); ok && a.Flags&slotv1.AcquireHold == 0 {
			f.mu.Lock()
			gate := f.acquireGate
			f.waitUS = a.WaitUS
			if gate != nil {
				f.requests["acquire gated"]++
			}
			f.mu.Unlock()
			if gate != nil {
				<-gate
			}
		}
		if a, ok := fr.Msg.(*slotv1.Acquire); ok && a.Flags&slotv1.AcquireHold != 0 {
			f.mu.Lock()
			gate, delay := f.holdGate, f.holdDelay
			if gate != nil {
				f.requests["hold gated"]++
			}
			f.mu.Unlock()
			if gate != nil {
				<-gate
			}
			time.Sleep(delay)
		}
		resp, fds := f.handle(fr.Msg, sent)
		if resp != nil {
			f.reply(cn, fr.Request, resp, fds)
		}
	}
}

func (f *fakeAgent) handle(m slotv1.Message, sent map[uint32]bool) (slotv1.Message, []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	grant := func(s *fakeSlot, outcome slotv1.Outcome, place slotv1.Place) (slotv1.Message, []int) {
		f.nextLease++
		f.leases[f.nextLease] = s.id
		s.leasedTo = f.nextLease
		ok := &slotv1.AcquireOK{Lease: f.nextLease, Slot: s.id, QuotaMilli: s.quota, PeriodUS: 100000, Outcome: outcome, Place: place}
		if sent[s.id] {
			return ok, nil
		}
		sent[s.id] = true
		s.given = true
		ok.NumFDs = 2
		return ok, []int{int(s.placeW.Fd()), int(s.stat.Fd())}
	}
	switch m := m.(type) {
	case *slotv1.Hello:
		f.requests["hello"]++
		f.hellos = append(f.hellos, m.Flags)
		h := &slotv1.HelloOK{Version: 1, Hierarchy: 2, PlaceFDs: 1, StatFDs: 1, Container: "fake"}
		if f.sayBudget {
			h.BudgetMilli = f.budget
		}
		if f.lend {
			h.Flags |= slotv1.HelloOKLend
		}
		if f.local && m.Flags&slotv1.HelloLocal != 0 {
			h.Flags |= slotv1.HelloOKLocal
			if f.holdList {
				h.Flags |= slotv1.HelloOKHoldList
			}
		}
		return h, nil
	case *slotv1.Acquire:
		if m.Flags&slotv1.AcquireHold != 0 {
			f.requests["hold"]++
			if !f.local {
				return &slotv1.Error{Code: slotv1.CodeBadRequest, Message: "HOLD without LOCAL"}, nil
			}
		} else {
			f.requests["acquire"]++
		}
		if s := f.slots[1]; f.notGrant && s != nil {
			return &slotv1.ReleaseOK{}, []int{int(s.placeW.Fd()), int(s.stat.Fd())}
		}
		if s := f.slots[1]; f.errorFDs && s != nil {
			return &slotv1.Error{Code: slotv1.CodeRejected, Message: "with fds"}, []int{int(s.placeW.Fd()), int(s.stat.Fd())}
		}
		if f.budget > 0 {
			used := m.QuotaMilli
			for _, id := range f.leases {
				used += f.slots[id].quota
			}
			if used > f.budget && f.queue && m.WaitUS > 0 {
				// Poll under the lock's release: RELEASEs on other
				// connections free the budget.
				for deadline := time.Now().Add(time.Duration(m.WaitUS) * time.Microsecond); used > f.budget; {
					if time.Now().After(deadline) {
						f.requests["timeout"]++
						return &slotv1.Error{Code: slotv1.CodeTimeout, Message: "queued too long"}, nil
					}
					f.mu.Unlock()
					time.Sleep(200 * time.Microsecond)
					f.mu.Lock()
					used = m.QuotaMilli
					for _, id := range f.leases {
						used += f.slots[id].quota
					}
				}
			}
			if used > f.budget {
				f.requests["rejected"]++
				return &slotv1.Error{Code: slotv1.CodeRejected, Message: "over budget"}, nil
			}
		}
		for id := uint32(1); id <= uint32(len(f.slots)); id++ {
			if s := f.slots[id]; s.quota == m.QuotaMilli && s.leasedTo == 0 && (!f.ownSlots || !s.given || sent[s.id]) {
				return grant(s, slotv1.OutcomeCacheHit, slotv1.PlaceSelf)
			}
		}
		s := f.newSlot(m.QuotaMilli)
		if s == nil {
			return &slotv1.Error{Code: slotv1.CodeInternal, Message: "no slot"}, nil
		}
		return grant(s, slotv1.OutcomeCreated, slotv1.PlaceSelf)
	case *slotv1.Reclaim:
		f.requests["reclaim"]++
		f.reclaims = append(f.reclaims, *m)
		s := f.slots[m.Slot]
		if f.refuseReclaim || s == nil || s.leasedTo != 0 {
			return &slotv1.Error{Code: slotv1.CodeUnknownLease, Message: "no such slot"}, nil
		}
		return grant(s, slotv1.OutcomeAffinityHit, slotv1.PlaceNone)
	case *slotv1.Release:
		if m.Flags&(slotv1.ReleaseSleep|slotv1.ReleaseWake) != 0 {
			what := "sleep"
			if m.Flags&slotv1.ReleaseWake != 0 {
				what = "wake"
			}
			f.sleepWakes = append(f.sleepWakes, fmt.Sprintf("%s %d", what, m.Lease))
			if m.Flags&slotv1.ReleaseNoReply != 0 {
				return nil, nil
			}
			if f.refuseSleep && what == "sleep" {
				return &slotv1.Error{Code: slotv1.CodeRejected, RetryAfterMS: 1, Message: "SLEEP rate"}, nil
			}
			return &slotv1.ReleaseOK{}, nil
		}
		f.requests["release"]++
		id, ok := f.leases[m.Lease]
		if ok {
			delete(f.leases, m.Lease)
			f.slots[id].leasedTo = 0
			f.released = append(f.released, m.Lease)
		} else {
			f.unknownReleases++
		}
		if m.Flags&slotv1.ReleaseNoReply != 0 {
			return nil, nil
		}
		if !ok {
			return &slotv1.Error{Code: slotv1.CodeUnknownLease, Message: "unknown lease"}, nil
		}
		return &slotv1.ReleaseOK{}, nil
	case *slotv1.HoldListRequest:
		f.requests["held"]++
		if !f.holdList {
			return &slotv1.Error{Code: slotv1.CodeBadRequest, Message: "unknown message type 0x06"}, nil
		}
		ok := &slotv1.HoldListOK{BudgetMilli: f.budget}
		var used uint32
		for lease, id := range f.leases {
			q := f.slots[id].quota
			if g, set := f.granted[lease]; set {
				q = g
			}
			used += q
			l := slotv1.HoldLease{Lease: lease, Slot: id, QuotaMilli: q}
			if f.degraded[lease] {
				l.Flags = slotv1.HoldDegraded
			}
			ok.Leases = append(ok.Leases, l)
		}
		if f.budget > 0 && used > f.budget {
			ok.GiveBackMilli = used - f.budget
		}
		return ok, nil
	case *slotv1.Usage:
		f.requests["usage"]++
		f.usage = append(f.usage, *m)
		return nil, nil
	}
	return &slotv1.Error{Code: slotv1.CodeBadRequest, Message: fmt.Sprintf("unexpected %T", m)}, nil
}

func (f *fakeAgent) reply(cn *net.UnixConn, req uint32, m slotv1.Message, fds []int) {
	b, err := slotv1.Append(nil, req, m)
	if err != nil {
		f.t.Error(err)
		return
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := cn.WriteMsgUnix(b, oob, nil); err != nil && !errors.Is(err, net.ErrClosed) {
		return
	}
}

// waitFor polls ok until it holds; the bound only keeps a broken test from
// hanging.
func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
