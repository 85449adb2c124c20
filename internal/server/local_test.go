package server_test

// Local leasing (SPEC.md, "Local leasing"): HOLD leases and USAGE reports
// against the real agent on the real kernel's cgroups. The attacks pass
// when the attack fails.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/counters"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"github.com/cpuslot/cpuslot/internal/pool"
)

// syncConn sends a request that is answered (a RELEASE of a lease nobody
// holds), so that every one-way frame sent before it has been handled.
func syncConn(t *testing.T, c net.Conn) {
	t.Helper()
	c.Write(agenttest.Frame(t, &slotv1.Release{Lease: 0}))
	if m, _ := agenttest.ReadFDs(t, c); !agenttest.IsErr(m, slotv1.CodeUnknownLease) {
		t.Fatalf("sync: %+v", m)
	}
}

// TestLocalHoldGrant: a LOCAL connection gets HOLD leases with the slot's
// fds and place SELF, once per slot and connection; their releases are
// counted under _hold; a HOLD lease ends no other.
func TestLocalHoldGrant(t *testing.T) {
	e := agenttest.LocalEnv(t, nil)
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := agenttest.LocalConn(t, e.Socket, l)
	place, stat := e.H.SlotFDs()

	var leases []uint64
	slots := map[uint32]bool{}
	for i := 0; i < 2; i++ {
		c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 0)))
		m, nfds := agenttest.ReadFDs(t, c)
		g, ok := m.(*slotv1.AcquireOK)
		if !ok || g.Place != slotv1.PlaceSelf || int(g.NumFDs) != place+stat || nfds != place+stat || g.QuotaMilli != 250 {
			t.Fatalf("hold %d: %+v with %d fds, want place SELF and %d fds", i, m, nfds, place+stat)
		}
		leases = append(leases, g.Lease)
		slots[g.Slot] = true
	}
	if len(slots) != 2 {
		t.Fatalf("two HOLD leases share a slot: %v", slots)
	}
	// A thread's lease of the same process ends no HOLD lease.
	c.Write(agenttest.Frame(t, &slotv1.Acquire{QuotaMilli: 500, TID: l.TIDs[0]}))
	tl, _ := agenttest.ReadFDs(t, c)
	if _, ok := tl.(*slotv1.AcquireOK); !ok {
		t.Fatalf("thread acquire: %+v", tl)
	}
	if s := a.Summaries()[0]; s.Leases != 3 || s.UsedMilli != 1000 {
		t.Fatalf("while held: %+v", s)
	}
	c.Write(agenttest.Frame(t, &slotv1.Release{Lease: leases[0], Flags: slotv1.ReleaseNoReply}))
	c.Write(agenttest.Frame(t, &slotv1.Release{Lease: leases[1], Outcome: slotv1.InvocationFailed}))
	if m, _ := agenttest.ReadFDs(t, c); !agenttest.IsReleaseOK(m) {
		t.Fatalf("release: %+v", m)
	}
	// The connection has the fds of both slots: a new HOLD lease of one of
	// them comes without.
	c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 0)))
	m, nfds := agenttest.ReadFDs(t, c)
	if g, ok := m.(*slotv1.AcquireOK); !ok || !slots[g.Slot] || g.NumFDs != 0 || nfds != 0 || g.Place != slotv1.PlaceSelf {
		t.Fatalf("hold of a slot the connection knows: %+v with %d fds", m, nfds)
	}
	body := agenttest.Scrape(t, a)
	for _, want := range []string{
		`cpuslot_lease_releases_total{action="_hold",container="` + e.Rel + `",cpuslot_container="` + e.Rel + `",namespace="",outcome="ok",pod=""} 1`,
		`cpuslot_lease_releases_total{action="_hold",container="` + e.Rel + `",cpuslot_container="` + e.Rel + `",namespace="",outcome="failed",pod=""} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("missing %s:\n%s", want, agenttest.Grep(body, "lease_releases_total"))
		}
	}
}

// TestAttackHoldWithoutLocal: HOLD (and RECLAIM of a HOLD lease) from a
// connection that was not granted LOCAL is BAD_REQUEST: without fds
// (AGENT_PLACES) a HOLD lease could not be used, and a client that did not
// ask for LOCAL does not get leases without a thread.
func TestAttackHoldWithoutLocal(t *testing.T) {
	e := agenttest.LocalEnv(t, nil)
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	for _, flags := range []uint32{slotv1.HelloFDPassing, slotv1.HelloLocal, 0} {
		c := l.Dial(t, e.Socket)
		c.SetDeadline(time.Now().Add(time.Minute))
		if ok := agenttest.HelloWith(t, c, flags); ok.Flags&slotv1.HelloOKLocal != 0 {
			t.Fatalf("hello flags %b: LOCAL granted (%b)", flags, ok.Flags)
		}
		c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 0)))
		m, nfds := agenttest.ReadFDs(t, c)
		agenttest.WantCode(t, fmt.Sprintf("HOLD after hello flags %b", flags), m, slotv1.CodeBadRequest)
		if nfds != 0 {
			t.Fatalf("fds sent with a refusal")
		}
		c.Write(agenttest.Frame(t, &slotv1.Reclaim{Slot: 1, QuotaMilli: 250}))
		m, _ = agenttest.ReadFDs(t, c)
		agenttest.WantCode(t, fmt.Sprintf("RECLAIM tid 0 after hello flags %b", flags), m, slotv1.CodeBadRequest)
	}
	if s := a.Summaries()[0]; s.Leases != 0 || s.UsedMilli != 0 {
		t.Fatalf("leases granted: %+v", s)
	}
}

// TestLocalOnlyInAffinityMode: the research baselines have the agent place
// every thread; a pool in one of them grants no LOCAL, so a baseline stays
// what it measures.
func TestLocalOnlyInAffinityMode(t *testing.T) {
	e := agenttest.LocalEnv(t, func(c *agent.Config) { c.Pool.Mode = "cache-eager" })
	e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := l.Dial(t, e.Socket)
	c.SetDeadline(time.Now().Add(time.Minute))
	if ok := agenttest.HelloWith(t, c, slotv1.HelloFDPassing|slotv1.HelloLocal); ok.Flags&slotv1.HelloOKLocal != 0 {
		t.Fatalf("cache-eager granted LOCAL: %b", ok.Flags)
	}
}

// TestAttackHoldMalformed: a HOLD that names a thread, a current slot, an
// agent placement, an action or an invocation is BAD_REQUEST; the
// connection serves a valid HOLD after.
func TestAttackHoldMalformed(t *testing.T) {
	e := agenttest.LocalEnv(t, nil)
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := agenttest.LocalConn(t, e.Socket, l)
	for name, m := range map[string]*slotv1.Acquire{
		"tid":           {QuotaMilli: 250, Flags: slotv1.AcquireHold, TID: l.TIDs[0]},
		"current slot":  {QuotaMilli: 250, Flags: slotv1.AcquireHold, CurrentSlot: 1},
		"agent places":  {QuotaMilli: 250, Flags: slotv1.AcquireHold | slotv1.AcquireAgentPlaces},
		"agent+tid":     {QuotaMilli: 250, Flags: slotv1.AcquireHold | slotv1.AcquireAgentPlaces, TID: l.TIDs[0]},
		"action":        {QuotaMilli: 250, Flags: slotv1.AcquireHold, Action: "guest/a"},
		"invocation":    {QuotaMilli: 250, Flags: slotv1.AcquireHold, Invocation: "id"},
		"reclaim+inv":   nil, // below
		"invalid quota": {QuotaMilli: 0, Flags: slotv1.AcquireHold},
	} {
		if m == nil {
			continue
		}
		c.Write(agenttest.Frame(t, m))
		resp, nfds := agenttest.ReadFDs(t, c)
		want := slotv1.CodeBadRequest
		if name == "invalid quota" {
			want = slotv1.CodeInvalidQuota
		}
		agenttest.WantCode(t, "HOLD with "+name, resp, want)
		if nfds != 0 {
			t.Fatalf("HOLD with %s: fds sent with a refusal", name)
		}
	}
	// A RECLAIM of a HOLD lease names no invocation either.
	c.Write(agenttest.Frame(t, &slotv1.Reclaim{Slot: 1, QuotaMilli: 250, Invocation: "id"}))
	resp, _ := agenttest.ReadFDs(t, c)
	agenttest.WantCode(t, "RECLAIM tid 0 with an invocation", resp, slotv1.CodeBadRequest)
	if s := a.Summaries()[0]; s.Leases != 0 {
		t.Fatalf("a malformed HOLD was granted: %+v", s)
	}
	c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 0)))
	if m, _ := agenttest.ReadFDs(t, c); !agenttest.IsAcquireOK(m) {
		t.Fatalf("a valid HOLD after bad ones: %+v", m)
	}
}

// slotDirs counts the container's slot directories.
func slotDirs(e *agenttest.Env) int {
	d, _ := filepath.Glob(filepath.Join(e.H.CPURoot, e.Rel, cgroup.SlotPrefix+"*"))
	return len(d)
}

// TestAttackHoldBeyondMaxSlots: a process asks for HOLD leases until it is
// refused. It gets at most maxSlots (SLOT_UNAVAILABLE after), on any of
// its connections, and admission bounds them like any lease (REJECTED
// under policy reject).
func TestAttackHoldBeyondMaxSlots(t *testing.T) {
	t.Run("maxSlots", func(t *testing.T) {
		e := agenttest.LocalEnv(t, func(c *agent.Config) { c.Pool.MaxSlots = 4; c.Pool.Prewarm = "250m=2" })
		a := e.Start()
		l := agenttest.StartLive(t, e, e.Rel, 1)
		c := agenttest.LocalConn(t, e.Socket, l)
		c2 := agenttest.LocalConn(t, e.Socket, l)
		granted := 0
		var last slotv1.Message
		for i := 0; i < 8; i++ {
			cn := c
			if i%2 == 1 {
				cn = c2
			}
			cn.Write(agenttest.Frame(t, agenttest.HoldReq(250, 1000)))
			if last, _ = agenttest.ReadFDs(t, cn); agenttest.IsAcquireOK(last) {
				granted++
			} else {
				agenttest.WantCode(t, fmt.Sprintf("HOLD %d", i), last, slotv1.CodeSlotUnavailable)
			}
		}
		if granted != 4 {
			t.Fatalf("%d HOLD leases granted with maxSlots 4; last %+v", granted, last)
		}
		if n := slotDirs(e); n > 4 {
			t.Fatalf("%d slot directories with maxSlots 4", n)
		}
		if s := a.Summaries()[0]; s.Leases != 4 {
			t.Fatalf("summary %+v", s)
		}
	})
	t.Run("budget", func(t *testing.T) {
		e := agenttest.LocalEnv(t, func(c *agent.Config) {
			c.Pool.MaxSlots = 8
			c.Admission.Budget = "1"
			c.Admission.Policy = "reject"
		})
		a := e.Start()
		l := agenttest.StartLive(t, e, e.Rel, 1)
		c := agenttest.LocalConn(t, e.Socket, l)
		for i := 0; i < 4; i++ {
			c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 1000)))
			if m, _ := agenttest.ReadFDs(t, c); !agenttest.IsAcquireOK(m) {
				t.Fatalf("HOLD %d within the budget: %+v", i, m)
			}
		}
		c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 1000)))
		m, _ := agenttest.ReadFDs(t, c)
		agenttest.WantCode(t, "HOLD beyond the budget", m, slotv1.CodeRejected)
		if s := a.Summaries()[0]; s.UsedMilli > s.BudgetMilli || s.Leases != 4 {
			t.Fatalf("summary %+v", s)
		}
	})
}

// TestAttackHoldEverySlotAndDie: a process holds every slot the pool may
// have, then dies. Its HOLD leases are released as abandoned, the slots are
// free, the budget is back, and another process gets them.
func TestAttackHoldEverySlotAndDie(t *testing.T) {
	e := agenttest.LocalEnv(t, func(c *agent.Config) { c.Pool.MaxSlots = 5; c.Admission.Budget = "2" })
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := agenttest.LocalConn(t, e.Socket, l)
	held := 0
	for i := 0; i < 6; i++ {
		c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 1000)))
		if m, _ := agenttest.ReadFDs(t, c); agenttest.IsAcquireOK(m) {
			held++
		}
	}
	if s := a.Summaries()[0]; held != 5 || s.Leases != 5 || s.UsedMilli != 1250 {
		t.Fatalf("held %d: %+v", held, s)
	}
	other := agenttest.StartLive(t, e, e.Rel, 1)
	oc := agenttest.LocalConn(t, e.Socket, other)
	oc.Write(agenttest.Frame(t, agenttest.HoldReq(250, 1000)))
	if m, _ := agenttest.ReadFDs(t, oc); !agenttest.IsErr(m, slotv1.CodeSlotUnavailable) {
		t.Fatalf("another process while every slot is held: %+v", m)
	}
	// The holder dies: the kernel closes its connections.
	l.Pair.Close()
	c.Close()
	agenttest.WaitFor(t, "the dead process's HOLD leases to be released", func() bool {
		s := a.Summaries()[0]
		return s.Leases == 0 && s.UsedMilli == 0
	})
	for i := 0; i < 5; i++ {
		oc.Write(agenttest.Frame(t, agenttest.HoldReq(250, 1000)))
		if m, _ := agenttest.ReadFDs(t, oc); !agenttest.IsAcquireOK(m) {
			t.Fatalf("HOLD %d after the holder died: %+v", i, m)
		}
	}
	if body := agenttest.Scrape(t, a); !strings.Contains(body, `cpuslot_lease_releases_total{action="_hold",container="`+e.Rel+`",cpuslot_container="`+e.Rel+`",namespace="",outcome="abandoned",pod=""} 5`) {
		t.Errorf("abandoned HOLD leases not counted:\n%s", agenttest.Grep(body, "lease_releases_total"))
	}
}

// TestAttackHoldOnDeadOpenersSocket: P holds three
// slots and exits while another process keeps its socket (the test here,
// as a forked child that inherited it would). The dead process's HOLD
// leases end without the socket closing, and nothing more is granted,
// answered or credited on a connection whose opener is gone: each request
// is NOT_SERVED (and the connection closed) or finds it closed already.
func TestAttackHoldOnDeadOpenersSocket(t *testing.T) {
	e := agenttest.LocalEnv(t, nil)
	a := e.Start()
	hello := &slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: slotv1.HelloFDPassing | slotv1.HelloLocal}
	c, pid := agenttest.ConnectedByChild(t, e, e.Rel, hello, agenttest.HoldReq(250, 0), agenttest.HoldReq(250, 0), agenttest.HoldReq(250, 0))
	c.SetDeadline(time.Now().Add(time.Minute))
	// P (pid) has exited; the test keeps its socket open. Its leases must
	// end: poll, with a bound that only keeps a broken agent from hanging.
	var s pool.Summary
	deadline := time.Now().Add(time.Minute)
	for s = a.Summaries()[0]; s.Leases != 0 || s.UsedMilli != 0; s = a.Summaries()[0] {
		if time.Now().After(deadline) {
			t.Fatalf("a minute after process %d exited, its socket still open: %d leases, %dm used", pid, s.Leases, s.UsedMilli)
		}
		time.Sleep(10 * time.Millisecond)
	}
	wantRefused(t, "HOLD on the dead opener's socket", c, agenttest.Frame(t, agenttest.HoldReq(250, 0)))

	// Each request that grants or keeps fds or budget, on a connection
	// whose opener has gone (and whose HELLO was granted LOCAL).
	requests := map[string][]byte{
		"HOLD":                 agenttest.Frame(t, agenttest.HoldReq(250, 0)),
		"ACQUIRE":              agenttest.Frame(t, &slotv1.Acquire{QuotaMilli: 250, TID: 1}),
		"HOLD_LIST":            agenttest.Frame(t, &slotv1.HoldListRequest{}),
		"RECLAIM of a HOLD":    agenttest.Frame(t, &slotv1.Reclaim{Slot: 1, QuotaMilli: 250}),
		"USAGE (then RELEASE)": append(usageFrame(t, slotv1.UsageRecord{Action: "ghost", Outcome: slotv1.InvocationOK, Invocations: 5}), agenttest.Frame(t, &slotv1.Release{Lease: 0})...),
		"RELEASE of no lease":  agenttest.Frame(t, &slotv1.Release{Lease: 0}),
	}
	for what, req := range requests {
		c, _ := agenttest.ConnectedByChild(t, e, e.Rel, hello)
		c.SetDeadline(time.Now().Add(time.Minute))
		wantRefused(t, what+" after the opener exited", c, req)
	}
	settleUsage(a)
	if body := agenttest.Scrape(t, a); strings.Contains(body, `"ghost"`) {
		t.Errorf("USAGE of a dead opener was credited:\n%s", agenttest.Grep(body, "ghost"))
	}
	if s := a.Summaries()[0]; s.Leases != 0 || s.UsedMilli != 0 {
		t.Errorf("after requests on dead openers' sockets: %d leases, %dm used", s.Leases, s.UsedMilli)
	}
}

// wantRefused sends req on c, whose opener is gone: the answer must be
// NOT_SERVED and the connection closed, or the connection closed already.
func wantRefused(t *testing.T, what string, c net.Conn, req []byte) {
	t.Helper()
	if _, err := c.Write(req); err != nil {
		return // closed by the agent already
	}
	body, fds, err := agenttest.ReadRawFrame(c.(*net.UnixConn))
	for _, fd := range fds {
		unix.Close(fd)
	}
	if err != nil {
		if errors.Is(err, io.EOF) || agenttest.ClosedByAgent(err) {
			return
		}
		t.Fatalf("%s: %v", what, err)
	}
	f, err := slotv1.DecodeBody(body)
	if err != nil {
		t.Fatal(err)
	}
	agenttest.WantCode(t, what, f.Msg, slotv1.CodeNotServed)
	wantClosed(t, what, c)
}

// usageFrame encodes a USAGE through the codec.
func usageFrame(t *testing.T, recs ...slotv1.UsageRecord) []byte {
	t.Helper()
	return agenttest.Frame(t, &slotv1.Usage{Records: recs})
}

// TestLocalUsage: USAGE lands in the per-action series a RELEASE feeds,
// is never answered, and is credited up to what the process's held slots
// used: a thread of the test burns CPU in a held slot, the reports split
// it among outcomes, and a last report claiming more than is left gets
// what is left.
func TestLocalUsage(t *testing.T) {
	e := agenttest.LocalEnv(t, nil)
	a := e.Start()
	cgrouptest.JoinProcess(t, e.H, e.Rel)
	raw, err := net.Dial("unix", e.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := raw.(*net.UnixConn)
	c.SetDeadline(time.Now().Add(time.Minute))
	if ok := agenttest.HelloWith(t, c, slotv1.HelloFDPassing|slotv1.HelloLocal); ok.Flags&slotv1.HelloOKLocal == 0 {
		t.Fatalf("LOCAL not granted: flags %b", ok.Flags)
	}
	c.Write(agenttest.Frame(t, agenttest.HoldReq(1000, 0)))
	_, fds, err := agenttest.ReadRawFrame(c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	place, stat := e.H.SlotFDs()
	if len(fds) != place+stat {
		t.Fatalf("%d fds with the HOLD grant, want %d", len(fds), place+stat)
	}
	burnt := burnInSlot(t, fds[:place], fds[place:])
	half, quarter := burnt/2, burnt/4
	c.Write(usageFrame(t,
		slotv1.UsageRecord{Action: "guest/fib", Outcome: slotv1.InvocationOK, Invocations: 3, CPUNanos: half},
		slotv1.UsageRecord{Action: "guest/fib", Outcome: slotv1.InvocationTimeout, Invocations: 1, CPUNanos: quarter},
		slotv1.UsageRecord{Action: "", Outcome: slotv1.InvocationFailed, Invocations: 2}))
	c.Write(usageFrame(t, slotv1.UsageRecord{Action: "guest/fib", Outcome: slotv1.InvocationOK, Invocations: 1, CPUNanos: burnt}))
	syncConn(t, c) // also: no answer came to either USAGE
	settleUsage(a)
	body := agenttest.Scrape(t, a)
	for _, want := range []string{
		`cpuslot_lease_releases_total{action="guest/fib",container="` + e.Rel + `",cpuslot_container="` + e.Rel + `",namespace="",outcome="ok",pod=""} 4`,
		`cpuslot_lease_releases_total{action="guest/fib",container="` + e.Rel + `",cpuslot_container="` + e.Rel + `",namespace="",outcome="timeout",pod=""} 1`,
		`cpuslot_lease_releases_total{action="_unnamed",container="` + e.Rel + `",cpuslot_container="` + e.Rel + `",namespace="",outcome="failed",pod=""} 2`,
		`cpuslot_errors_total{reason="usage_overclaimed"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("missing %s:\n%s", want, agenttest.Grep(body, "guest/fib"))
		}
	}
	// Credited: all the slot used by the time of the last report, which is
	// what the test's thread burnt there and the little it used after its
	// last counter read; never the 1.75x claimed.
	v, ok := agenttest.MetricValue(body, `cpuslot_invocation_cpu_seconds_total{action="guest/fib",container="`+e.Rel+`",cpuslot_container="`+e.Rel+`",namespace="",pod=""}`)
	if !ok {
		t.Fatalf("no CPU series for guest/fib:\n%s", agenttest.Grep(body, "guest/fib"))
	}
	got := time.Duration(v * 1e9)
	t.Logf("burnt %v in the slot, claimed %v, credited %v", time.Duration(burnt), time.Duration(half+quarter+burnt), got)
	if got < time.Duration(burnt)-time.Microsecond || got > time.Duration(burnt)+time.Duration(burnt)/4 {
		t.Errorf("credited %v for a slot that used %v", got, time.Duration(burnt))
	}
}

// burnInSlot moves a new thread of the test into a slot through its
// placement fds, burns CPU there until the slot's counter fds show 200 ms,
// and ends the thread; it returns what the counters advanced.
func burnInSlot(t *testing.T, place, stat []int) uint64 {
	t.Helper()
	acct := -1
	if len(stat) > 1 {
		acct = stat[1]
	}
	read := func() uint64 {
		u, err := counters.Read(stat[0], acct)
		if err != nil {
			t.Error(err)
		}
		return u.CPUNanos
	}
	before := read()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		for _, fd := range place {
			if _, err := unix.Write(fd, []byte("0")); err != nil {
				done <- err
				return
			}
		}
		for read()-before < uint64(200*time.Millisecond) {
			cgrouptest.BurnCPU(t, 10*time.Millisecond)
		}
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatalf("placing a thread in the held slot: %v", err)
	}
	return read() - before
}

// actionLabels lists the distinct action label values of
// cpuslot_lease_releases_total.
func actionLabels(body string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, `cpuslot_lease_releases_total{action="`)
		if !ok {
			continue
		}
		if i := strings.Index(rest, `"`); i >= 0 {
			out[rest[:i]] = true
		}
	}
	return out
}

// TestAttackUsageActionFlood: USAGE naming 200 distinct actions gets the
// first maxActions of them a series each and counts the rest as _other:
// the label count stays bounded, nothing is lost.
func TestAttackUsageActionFlood(t *testing.T) {
	const maxActions = 10
	e := agenttest.LocalEnv(t, func(c *agent.Config) { c.Pool.MaxActions = maxActions })
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := agenttest.LocalConn(t, e.Socket, l)
	holdOne(t, c)
	before := len(actionLabels(agenttest.Scrape(t, a)))
	var recs []slotv1.UsageRecord
	for i := 0; i < 200; i++ {
		recs = append(recs, slotv1.UsageRecord{Action: fmt.Sprintf("flood-%03d", i), Outcome: slotv1.InvocationOK, Invocations: 1, CPUNanos: 1_000_000})
		if len(recs) == slotv1.MaxUsageRecords {
			c.Write(usageFrame(t, recs...))
			recs = recs[:0]
		}
	}
	syncConn(t, c)
	settleUsage(a)
	body := agenttest.Scrape(t, a)
	labels := actionLabels(body)
	if n := len(labels) - before; n > maxActions+1 {
		t.Fatalf("200 action names made %d new labels, want at most %d and _other: %v", n, maxActions, labels)
	}
	if !labels["flood-000"] || labels["flood-199"] {
		t.Fatalf("labels %v", labels)
	}
	if want := fmt.Sprintf(`cpuslot_lease_releases_total{action="_other",container="`+e.Rel+`",cpuslot_container="`+e.Rel+`",namespace="",outcome="ok",pod=""} %d`, 200-maxActions); !strings.Contains(body, want) {
		t.Fatalf("missing %s:\n%s", want, agenttest.Grep(body, "_other"))
	}
}

// wantClosed reads c to its end: the agent must close it, after at most
// the error it answered.
func wantClosed(t *testing.T, what string, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadAll(c); !agenttest.ClosedByAgent(err) {
		t.Fatalf("%s: connection not closed: %v", what, err)
	}
}

// TestAttackUsageWithoutLocal: a USAGE before HELLO, or on a connection
// not granted LOCAL, is BAD_REQUEST and closes the connection (a one-way
// message's sender reads no answer: the connection is out of step);
// nothing is counted.
func TestAttackUsageWithoutLocal(t *testing.T) {
	e := agenttest.LocalEnv(t, nil)
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	u := usageFrame(t, slotv1.UsageRecord{Action: "sneaky", Outcome: slotv1.InvocationOK, Invocations: 7, CPUNanos: 1e9})

	c := l.Dial(t, e.Socket)
	c.SetDeadline(time.Now().Add(time.Minute))
	c.Write(u)
	m, _ := agenttest.ReadFDs(t, c)
	agenttest.WantCode(t, "USAGE before HELLO", m, slotv1.CodeBadRequest)
	wantClosed(t, "USAGE before HELLO", c)

	for _, flags := range []uint32{slotv1.HelloFDPassing, slotv1.HelloLocal, 0} {
		c := l.Dial(t, e.Socket)
		c.SetDeadline(time.Now().Add(time.Minute))
		agenttest.HelloWith(t, c, flags)
		c.Write(u)
		m, _ := agenttest.ReadFDs(t, c)
		agenttest.WantCode(t, fmt.Sprintf("USAGE after hello flags %b", flags), m, slotv1.CodeBadRequest)
		wantClosed(t, "USAGE without LOCAL", c)
	}
	if body := agenttest.Scrape(t, a); strings.Contains(body, "sneaky") {
		t.Fatalf("USAGE without LOCAL was counted:\n%s", agenttest.Grep(body, "sneaky"))
	}
}

// usageBody builds a USAGE frame from raw payload bytes: an attacker does
// not use the encoder.
func usageBody(payload []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(6+len(payload)))
	b = append(b, slotv1.Version, slotv1.TypeUsage, 0, 0, 0, 9)
	return append(b, payload...)
}

// usageRecord encodes one record with raw fields.
func usageRecord(action []byte, outcome uint8, n uint32, cpu, thr uint64) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(action)))
	b = append(b, action...)
	b = append(b, outcome)
	b = binary.BigEndian.AppendUint32(b, n)
	b = binary.BigEndian.AppendUint64(b, cpu)
	return binary.BigEndian.AppendUint64(b, thr)
}

// TestAttackUsageMalformed: each malformed USAGE is answered BAD_REQUEST
// and closes the connection; none of it is counted, and the agent serves
// the next connection.
func TestAttackUsageMalformed(t *testing.T) {
	e := agenttest.LocalEnv(t, nil)
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	ok := usageRecord([]byte("mal-ok"), 0, 1, 1e9, 0)
	var nine []byte
	for i := 0; i < 9; i++ {
		nine = append(nine, usageRecord([]byte(fmt.Sprintf("mal-%d", i)), 0, 1, 1, 0)...)
	}
	cases := map[string][]byte{
		"no records":        {0},
		"nine records":      append([]byte{9}, nine...),
		"placement failed":  append([]byte{1}, usageRecord([]byte("mal-pf"), 3, 1, 1, 0)...),
		"unknown outcome":   append([]byte{1}, usageRecord([]byte("mal-uo"), 200, 1, 1, 0)...),
		"zero invocations":  append([]byte{1}, usageRecord([]byte("mal-zero"), 0, 0, 1, 0)...),
		"invalid UTF-8":     append([]byte{1}, usageRecord([]byte{'m', 'a', 'l', 0xff}, 0, 1, 1, 0)...),
		"control character": append([]byte{1}, usageRecord([]byte("mal\nx"), 0, 1, 1, 0)...),
		"count too high":    append([]byte{2}, ok...),
		"bytes left over":   append(append([]byte{1}, ok...), 0),
		"truncated":         append([]byte{1}, ok[:len(ok)-3]...),
	}
	for name, payload := range cases {
		c := agenttest.LocalConn(t, e.Socket, l)
		c.Write(usageBody(payload))
		m, _ := agenttest.ReadFDs(t, c)
		agenttest.WantCode(t, "USAGE with "+name, m, slotv1.CodeBadRequest)
		wantClosed(t, "USAGE with "+name, c)
	}
	body := agenttest.Scrape(t, a)
	if strings.Contains(body, `action="mal`) {
		t.Fatalf("a malformed USAGE was counted:\n%s", agenttest.Grep(body, "mal"))
	}
	c := agenttest.LocalConn(t, e.Socket, l)
	holdOne(t, c)
	c.Write(usageBody(append([]byte{1}, ok...)))
	syncConn(t, c)
	settleUsage(a)
	if body := agenttest.Scrape(t, a); !strings.Contains(body, `cpuslot_lease_releases_total{action="mal-ok",container="`+e.Rel+`",cpuslot_container="`+e.Rel+`",namespace="",outcome="ok",pod=""} 1`) {
		t.Fatalf("a valid USAGE after malformed ones:\n%s", agenttest.Grep(body, "mal"))
	}
}

// TestAttackUsageAbsurdCPU: a USAGE may claim any numbers. The agent
// survives the largest values (no overflow into a negative counter
// increment, which the metrics library refuses with a panic) and credits
// what the process's held slots allow: it holds none, so nothing, and
// the action gets no series.
func TestAttackUsageAbsurdCPU(t *testing.T) {
	e := agenttest.LocalEnv(t, nil)
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := agenttest.LocalConn(t, e.Socket, l)
	huge := slotv1.UsageRecord{Action: "absurd", Outcome: slotv1.InvocationOK, Invocations: math.MaxUint32,
		CPUNanos: math.MaxUint64, ThrottledNanos: math.MaxUint64}
	c.Write(usageFrame(t, huge, huge))
	syncConn(t, c)
	settleUsage(a)
	body := agenttest.Scrape(t, a)
	if strings.Contains(body, "absurd") {
		t.Errorf("a process holding no slot was credited:\n%s", agenttest.Grep(body, "absurd"))
	}
	if !strings.Contains(body, `cpuslot_errors_total{reason="usage_overclaimed"} 1`) {
		t.Errorf("the overclaim was not counted:\n%s", agenttest.Grep(body, "usage_overclaimed"))
	}
	c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 0)))
	if m, _ := agenttest.ReadFDs(t, c); !agenttest.IsAcquireOK(m) {
		t.Fatalf("the connection after absurd USAGE: %+v", m)
	}
}

// actionSeries names a per-action series of container ctr: name{action,
// container, outcome} (outcome "" for the CPU series), labels in the order
// a scrape prints them.
func actionSeries(name, action, ctr, outcome string) string {
	s := fmt.Sprintf(`%s{action=%q,container=%q,cpuslot_container=%q,namespace=""`, name, action, ctr, ctr)
	if outcome != "" {
		s += fmt.Sprintf(`,outcome=%q`, outcome)
	}
	return s + `,pod=""}`
}

// TestAttackUsageInflateCounts: a process of A
// that holds no slot reports 8 x (2^32-1) invocations of an action that
// B also runs. Nothing is credited, and B's series, which carry B's name,
// do not move. Once A holds a slot its reports are credited at most one
// invocation per microsecond it held the slot, under A's name.
func TestAttackUsageInflateCounts(t *testing.T) {
	e := agenttest.LocalEnv(t, nil)
	relB := cgrouptest.NewContainer(t, e.H, 0)
	e.Cfg.Standalone.Containers = []string{e.Rel, relB}
	a := e.Start()
	victim := agenttest.StartLive(t, e, relB, 1)
	vc := agenttest.LocalConn(t, e.Socket, victim)
	vc.Write(agenttest.Frame(t, &slotv1.Acquire{QuotaMilli: 250, TID: victim.TIDs[0], Action: "victim-act"}))
	m, _ := agenttest.ReadFDs(t, vc)
	g, ok := m.(*slotv1.AcquireOK)
	if !ok {
		t.Fatalf("B's acquire: %+v", m)
	}
	vc.Write(agenttest.Frame(t, &slotv1.Release{Lease: g.Lease}))
	if m, _ := agenttest.ReadFDs(t, vc); !agenttest.IsReleaseOK(m) {
		t.Fatalf("B's release: %+v", m)
	}

	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := agenttest.LocalConn(t, e.Socket, l)
	huge := slotv1.UsageRecord{Action: "victim-act", Outcome: slotv1.InvocationOK, Invocations: math.MaxUint32}
	var recs []slotv1.UsageRecord
	for i := 0; i < slotv1.MaxUsageRecords; i++ {
		recs = append(recs, huge)
	}
	c.Write(usageFrame(t, recs...))
	syncConn(t, c)
	settleUsage(a)
	body := agenttest.Scrape(t, a)
	wantB := actionSeries("cpuslot_lease_releases_total", "victim-act", relB, "ok")
	if v, ok := agenttest.MetricValue(body, wantB); !ok || v != 1 {
		t.Fatalf("B's series %s is %v (present %v), want 1:\n%s", wantB, v, ok, agenttest.Grep(body, "victim-act"))
	}
	if v, ok := agenttest.MetricValue(body, actionSeries("cpuslot_lease_releases_total", "victim-act", e.Rel, "ok")); ok && v != 0 {
		t.Fatalf("a process holding no slot was credited %v invocations:\n%s", v, agenttest.Grep(body, "victim-act"))
	}
	if !strings.Contains(body, `cpuslot_errors_total{reason="usage_overclaimed"} 1`) {
		t.Errorf("the overclaim was not counted:\n%s", agenttest.Grep(body, "usage_overclaimed"))
	}

	// Holding a slot, A is credited no more than its held time allows.
	start := time.Now()
	c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 0)))
	if m, _ := agenttest.ReadFDs(t, c); !agenttest.IsAcquireOK(m) {
		t.Fatalf("A's HOLD: %+v", m)
	}
	c.Write(usageFrame(t, recs...))
	syncConn(t, c)
	settleUsage(a) // settles as of a second from now
	held := time.Since(start) + time.Second
	body = agenttest.Scrape(t, a)
	gotA, _ := agenttest.MetricValue(body, actionSeries("cpuslot_lease_releases_total", "victim-act", e.Rel, "ok"))
	t.Logf("A held a slot at most %v and was credited %v of %v invocations claimed", held, gotA, float64(len(recs))*math.MaxUint32)
	if gotA == 0 || gotA > float64(held/time.Microsecond) {
		t.Errorf("A credited %v invocations for a slot held at most %v", gotA, held)
	}
	if v, _ := agenttest.MetricValue(body, wantB); v != 1 {
		t.Errorf("B's series moved to %v:\n%s", v, agenttest.Grep(body, "victim-act"))
	}
}

// TestLocalReclaimAfterRestart: HOLD leases survive an agent restart: the
// new agent adopts the slots and the process re-declares each with RECLAIM
// tid 0, also beyond the new agent's budget (the invocations run already),
// which then leaves no room for more.
func TestLocalReclaimAfterRestart(t *testing.T) {
	e := agenttest.LocalEnv(t, func(c *agent.Config) { c.Pool.Prewarm = "500m=3" })
	e.Cfg.Socket = filepath.Join(e.Dir, "first.sock")
	a, stop := agenttest.RunAgent(t, e.H, e.Cfg, false)
	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := agenttest.LocalConn(t, e.Cfg.Socket, l)
	type held struct{ slot, quota uint32 }
	var hs []held
	for i := 0; i < 3; i++ {
		c.Write(agenttest.Frame(t, agenttest.HoldReq(500, 0)))
		m, _ := agenttest.ReadFDs(t, c)
		g, ok := m.(*slotv1.AcquireOK)
		if !ok {
			t.Fatalf("hold %d: %+v", i, m)
		}
		hs = append(hs, held{g.Slot, g.QuotaMilli})
	}
	// Another connection of the same process cannot take a lease over: a
	// lease is the connection's that holds it.
	c2 := agenttest.LocalConn(t, e.Cfg.Socket, l)
	c2.Write(agenttest.Frame(t, &slotv1.Reclaim{Slot: hs[0].slot, QuotaMilli: 500}))
	if m, _ := agenttest.ReadFDs(t, c2); !agenttest.IsErr(m, slotv1.CodeUnknownLease) {
		t.Fatalf("reclaim of a slot another connection holds: %+v", m)
	}
	if s := a.Summaries()[0]; s.Leases != 3 || s.UsedMilli != 1500 {
		t.Fatalf("before the restart: %+v", s)
	}
	stop() // the slots stay for the next agent

	e.Cfg.Socket = filepath.Join(e.Dir, "second.sock")
	e.Cfg.Admission.Budget = "1"
	a2, _ := agenttest.RunAgent(t, e.H, e.Cfg, true)
	c = l.Dial(t, e.Cfg.Socket)
	c.SetDeadline(time.Now().Add(time.Minute))
	agenttest.HelloWith(t, c, slotv1.HelloFDPassing|slotv1.HelloLocal)
	var leases []uint64
	for _, h := range hs {
		c.Write(agenttest.Frame(t, &slotv1.Reclaim{Slot: h.slot, QuotaMilli: h.quota}))
		m, nfds := agenttest.ReadFDs(t, c)
		g, ok := m.(*slotv1.AcquireOK)
		if !ok || g.Place != slotv1.PlaceNone {
			t.Fatalf("reclaim of slot %d after the restart: %+v", h.slot, m)
		}
		if int(g.NumFDs) != nfds {
			t.Fatalf("reclaim said %d fds, %d came", g.NumFDs, nfds)
		}
		leases = append(leases, g.Lease)
	}
	if s := a2.Summaries()[0]; s.Leases != 3 || s.UsedMilli != 1500 {
		t.Fatalf("after reclaiming: %+v", s)
	}
	body := agenttest.Scrape(t, a2)
	if !strings.Contains(body, `cpuslot_admission_total{result="reclaimed_over_budget"} 1`) {
		t.Errorf("over-budget reclaim not counted:\n%s", agenttest.Grep(body, "cpuslot_admission_total"))
	}
	// No room for more while over budget.
	c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 1000)))
	if m, _ := agenttest.ReadFDs(t, c); !agenttest.IsErr(m, slotv1.CodeTimeout) {
		t.Fatalf("HOLD while over budget: %+v", m)
	}
	// A slot of another process cannot be reclaimed.
	other := agenttest.StartLive(t, e, e.Rel, 1)
	oc := agenttest.LocalConn(t, e.Cfg.Socket, other)
	oc.Write(agenttest.Frame(t, &slotv1.Reclaim{Slot: hs[1].slot, QuotaMilli: 500}))
	if m, _ := agenttest.ReadFDs(t, oc); !agenttest.IsErr(m, slotv1.CodeUnknownLease) {
		t.Fatalf("reclaim of another process's slot: %+v", m)
	}
	for _, id := range leases {
		c.Write(agenttest.Frame(t, &slotv1.Release{Lease: id, Flags: slotv1.ReleaseNoReply}))
	}
	syncConn(t, c)
	if s := a2.Summaries()[0]; s.Leases != 0 || s.UsedMilli != 0 {
		t.Fatalf("after releasing: %+v", s)
	}
}

// TestAttackUsageFlood: a process floods USAGE frames (one-way, so no
// round trip paces it). Past the agent's rate they wait, and its
// connection is not read meanwhile: the flood blocks its sender, while
// another process is served; nothing of the flood is lost.
func TestAttackUsageFlood(t *testing.T) {
	const frames = 300
	e := agenttest.LocalEnv(t, nil)
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := agenttest.LocalConn(t, e.Socket, l)
	holdOne(t, c)
	var recs []slotv1.UsageRecord
	for i := 0; i < slotv1.MaxUsageRecords; i++ {
		recs = append(recs, slotv1.UsageRecord{Action: "flood", Outcome: slotv1.InvocationOK, Invocations: 1, CPUNanos: 1})
	}
	one := usageFrame(t, recs...)
	var all []byte
	for i := 0; i < frames; i++ {
		all = append(all, one...)
	}
	written := make(chan error, 1)
	go func() { _, err := c.Write(all); written <- err }()

	other := agenttest.StartLive(t, e, e.Rel, 1)
	oc := agenttest.LocalConn(t, e.Socket, other)
	for i := 0; i < 50; i++ {
		oc.Write(agenttest.Frame(t, agenttest.HoldReq(250, 0)))
		m, _ := agenttest.ReadFDs(t, oc)
		g, ok := m.(*slotv1.AcquireOK)
		if !ok {
			t.Fatalf("another process during the flood: %+v", m)
		}
		oc.Write(agenttest.Frame(t, &slotv1.Release{Lease: g.Lease, Flags: slotv1.ReleaseNoReply}))
	}
	if err := <-written; err != nil {
		t.Fatalf("writing the flood: %v", err)
	}
	syncConn(t, c)
	settleUsage(a)
	body := agenttest.Scrape(t, a)
	if want := fmt.Sprintf(`cpuslot_lease_releases_total{action="flood",container="`+e.Rel+`",cpuslot_container="`+e.Rel+`",namespace="",outcome="ok",pod=""} %d`, frames*slotv1.MaxUsageRecords); !strings.Contains(body, want) {
		t.Errorf("missing %s:\n%s", want, agenttest.Grep(body, "flood"))
	}
	if v, ok := agenttest.MetricValue(body, `cpuslot_errors_total{reason="usage_throttled"}`); !ok || v == 0 {
		t.Errorf("the flood was never paced:\n%s", agenttest.Grep(body, "cpuslot_errors_total"))
	}
}

// TestLocalHoldDegraded: a HOLD lease is admitted like any lease: under
// policy degrade it gets what the budget has left (flag DEGRADED), and is
// raised to what it asked once budget frees up.
func TestLocalHoldDegraded(t *testing.T) {
	e := agenttest.LocalEnv(t, func(c *agent.Config) { c.Admission.Budget = "1"; c.Admission.Policy = "degrade" })
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := agenttest.LocalConn(t, e.Socket, l)
	c.Write(agenttest.Frame(t, agenttest.HoldReq(800, 0)))
	first, _ := agenttest.ReadFDs(t, c)
	g, ok := first.(*slotv1.AcquireOK)
	if !ok || g.Flags&slotv1.AcquiredDegraded != 0 {
		t.Fatalf("first HOLD: %+v", first)
	}
	c.Write(agenttest.Frame(t, agenttest.HoldReq(500, 0)))
	m, _ := agenttest.ReadFDs(t, c)
	if d, ok := m.(*slotv1.AcquireOK); !ok || d.Flags&slotv1.AcquiredDegraded == 0 || d.QuotaMilli != 200 {
		t.Fatalf("HOLD beyond the budget under degrade: %+v", m)
	}
	c.Write(agenttest.Frame(t, &slotv1.Release{Lease: g.Lease, Flags: slotv1.ReleaseNoReply}))
	agenttest.WaitFor(t, "the degraded HOLD lease to be raised", func() bool {
		s := a.Summaries()[0]
		return s.Degraded == 0 && s.UsedMilli == 500
	})
}

// holdOne takes a HOLD lease of 250m on c: a process's USAGE is credited
// only for slots it holds.
func holdOne(t *testing.T, c net.Conn) {
	t.Helper()
	c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 0)))
	if m, _ := agenttest.ReadFDs(t, c); !agenttest.IsAcquireOK(m) {
		t.Fatalf("HOLD: %+v", m)
	}
}

// settleUsage has the agent count the USAGE records that wait for their
// process's next counter read (at most one read a second per process):
// a maintenance round one second on.
func settleUsage(a *agent.Agent) { a.Maintain(time.Now().Add(time.Second)) }

// TestAttackLeaseFromAnotherConnection: function code in a runtime opens a
// connection of its own to the agent (the same process, so the same
// container and peer) and works the runtime's HOLD lease from there: lists
// it (HOLD_LIST), puts it to sleep, releases it, and claims its usage (USAGE).
// Each is refused or ignored: a lease is touched only on the connection
// that holds it. Afterwards the lease is intact, charged in full, and its
// own connection still lists, sleeps and releases it.
func TestAttackLeaseFromAnotherConnection(t *testing.T) {
	e := agenttest.LocalEnv(t, func(c *agent.Config) { c.Admission.LendRatio = 1 })
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	owner := agenttest.LocalConn(t, e.Socket, l)
	owner.Write(agenttest.Frame(t, agenttest.HoldReq(250, 0)))
	m, _ := agenttest.ReadFDs(t, owner)
	g, ok := m.(*slotv1.AcquireOK)
	if !ok {
		t.Fatalf("HOLD: %+v", m)
	}
	thief := agenttest.LocalConn(t, e.Socket, l) // same process, same container

	thief.Write(agenttest.Frame(t, &slotv1.HoldListRequest{}))
	if m, _ := agenttest.ReadFDs(t, thief); !isHoldListOK(m, 0) {
		t.Errorf("HOLD_LIST on another connection lists the lease: %+v", m)
	}
	for _, req := range []*slotv1.Release{
		{Lease: g.Lease, Flags: slotv1.ReleaseSleep},
		{Lease: g.Lease, Flags: slotv1.ReleaseWake},
		{Lease: g.Lease},
	} {
		thief.Write(agenttest.Frame(t, req))
		m, _ := agenttest.ReadFDs(t, thief)
		agenttest.WantCode(t, fmt.Sprintf("RELEASE flags %b from another connection", req.Flags), m, slotv1.CodeUnknownLease)
	}
	// One-way: ignored and counted, nothing answered.
	thief.Write(agenttest.Frame(t, &slotv1.Release{Lease: g.Lease, Flags: slotv1.ReleaseSleep | slotv1.ReleaseNoReply}))
	thief.Write(agenttest.Frame(t, &slotv1.Release{Lease: g.Lease, Flags: slotv1.ReleaseNoReply}))
	thief.Write(usageFrame(t, slotv1.UsageRecord{Action: "stolen", Outcome: slotv1.InvocationOK, Invocations: 1, CPUNanos: 1e6}))
	syncConn(t, thief)
	if s := a.Summaries()[0]; s.Leases != 1 || s.UsedMilli != 250 || s.Lends != 0 || s.LentMilli != 0 {
		t.Fatalf("after the other connection's attempts: %+v, want the lease held, awake and charged 250m", s)
	}
	settleUsage(a)
	if body := agenttest.Scrape(t, a); strings.Contains(body, `action="stolen"`) {
		t.Errorf("a connection holding no lease was credited usage:\n%s", agenttest.Grep(body, "stolen"))
	}

	// The owner's connection still has it.
	owner.Write(agenttest.Frame(t, &slotv1.HoldListRequest{}))
	if m, _ := agenttest.ReadFDs(t, owner); !isHoldListOK(m, g.Lease) {
		t.Fatalf("HOLD_LIST on the holding connection: %+v", m)
	}
	owner.Write(agenttest.Frame(t, &slotv1.Release{Lease: g.Lease, Flags: slotv1.ReleaseSleep}))
	if m, _ := agenttest.ReadFDs(t, owner); !agenttest.IsReleaseOK(m) {
		t.Fatalf("SLEEP on the holding connection: %+v", m)
	}
	owner.Write(agenttest.Frame(t, &slotv1.Release{Lease: g.Lease}))
	if m, _ := agenttest.ReadFDs(t, owner); !agenttest.IsReleaseOK(m) {
		t.Fatalf("RELEASE on the holding connection: %+v", m)
	}
	if s := a.Summaries()[0]; s.Leases != 0 || s.UsedMilli != 0 {
		t.Fatalf("after the owner's release: %+v", s)
	}
}

// TestLeaseEndsWithItsConnection: a lease ends when the connection holding
// it closes, although the process keeps another connection open.
func TestLeaseEndsWithItsConnection(t *testing.T) {
	e := agenttest.LocalEnv(t, nil)
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	other := agenttest.LocalConn(t, e.Socket, l)
	owner := agenttest.LocalConn(t, e.Socket, l)
	holdOne(t, owner)
	holdOne(t, other)
	owner.Close()
	agenttest.WaitFor(t, "the closed connection's lease to end", func() bool {
		s := a.Summaries()[0]
		return s.Leases == 1 && s.UsedMilli == 250
	})
	syncConn(t, other)
}

// isHoldListOK reports whether m is a HOLD_LIST_OK listing exactly lease (none for 0).
func isHoldListOK(m slotv1.Message, lease uint64) bool {
	h, ok := m.(*slotv1.HoldListOK)
	if !ok {
		return false
	}
	if lease == 0 {
		return len(h.Leases) == 0
	}
	return len(h.Leases) == 1 && h.Leases[0].Lease == lease
}

// TestOneWayFramesPassWaitingAcquire: while a HOLD ACQUIRE waits for
// budget on a connection, the one-way RELEASE of the lease that holds the
// budget, sent on the same connection after it, is taken: the ACQUIRE is
// granted with the budget it frees, not refused when its wait is over.
// A request that needs an answer is answered after the ACQUIRE.
func TestOneWayFramesPassWaitingAcquire(t *testing.T) {
	e := agenttest.LocalEnv(t, func(c *agent.Config) { c.Admission.Budget = "500m" })
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := agenttest.LocalConn(t, e.Socket, l)
	c.Write(agenttest.Frame(t, agenttest.HoldReq(500, 0)))
	m, _ := agenttest.ReadFDs(t, c)
	g, ok := m.(*slotv1.AcquireOK)
	if !ok {
		t.Fatalf("HOLD: %+v", m)
	}
	// Waits far longer than the test's deadline: only the release ends it.
	c.Write(agenttest.Frame(t, agenttest.HoldReq(500, 3600e6)))
	agenttest.WaitFor(t, "the second HOLD to wait for budget", func() bool {
		v, _ := agenttest.MetricValue(agenttest.Scrape(t, a), `cpuslot_admission_total{result="queued"}`)
		return v > 0
	})
	c.Write(agenttest.Frame(t, &slotv1.Release{Lease: g.Lease, Flags: slotv1.ReleaseNoReply}))
	c.Write(agenttest.Frame(t, &slotv1.HoldListRequest{})) // answered after the ACQUIRE
	if m, _ := agenttest.ReadFDs(t, c); !agenttest.IsAcquireOK(m) {
		t.Fatalf("the waiting HOLD after the release of the lease it waited for: %+v", m)
	}
	if h, ok := agenttest.ReadResp(t, c).(*slotv1.HoldListOK); !ok || len(h.Leases) != 1 || h.Leases[0].Lease == g.Lease {
		t.Fatalf("HOLD_LIST after the ACQUIRE: %+v, want the new lease only", h)
	}
}
