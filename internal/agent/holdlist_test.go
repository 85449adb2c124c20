package agent_test

// Giving held slots back after a CPU limit shrink (SPEC.md, HOLD_LIST), against
// the real agent on the real kernel's cgroups.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
)

// setCPULimit writes the container's CPU limit, as an in-place resize does.
func setCPULimit(e *agenttest.Env, milli uint32) error {
	p, v := filepath.Join(e.H.CPURoot, e.Rel, "cpu.max"), fmt.Sprintf("%d 100000", milli*100)
	if e.H.Version == 1 {
		p, v = filepath.Join(e.H.CPURoot, e.Rel, "cpu.cfs_quota_us"), fmt.Sprint(milli*100)
	}
	return os.WriteFile(p, []byte(v), 0)
}

// shrinkEnv is a container of a 1000m limit with 250m slots only (cgroup
// v1 refuses a container quota below a child's), whose live children get
// fds.
func shrinkEnv(t *testing.T, mutate func(*agent.Config)) *agenttest.Env {
	return agenttest.NewEnv(t, 1000, func(c *agent.Config) {
		c.Limits.HostNamespaceFDs = true
		c.Pool.Prewarm = "250m=2"
		if mutate != nil {
			mutate(c)
		}
	})
}

// askHoldList sends HOLD_LIST on c until it is answered (a REJECTED for the rate is
// retried after its retry_after_ms, a bounded number of times).
func askHoldList(t *testing.T, c net.Conn) *slotv1.HoldListOK {
	t.Helper()
	for try := 0; try < 50; try++ {
		c.Write(agenttest.Frame(t, &slotv1.HoldListRequest{}))
		m, nfds := agenttest.ReadFDs(t, c)
		if nfds != 0 {
			t.Fatalf("fds sent with HOLD_LIST_OK")
		}
		if ok, isOK := m.(*slotv1.HoldListOK); isOK {
			return ok
		}
		pe, isErr := m.(*slotv1.Error)
		if !isErr || pe.Code != slotv1.CodeRejected || pe.RetryAfterMS == 0 {
			t.Fatalf("HOLD_LIST: %+v", m)
		}
		time.Sleep(time.Duration(pe.RetryAfterMS) * time.Millisecond)
	}
	t.Fatal("HOLD_LIST refused 50 times in a row")
	return nil
}

// TestLocalHoldListAfterShrink: after the limit shrinks from 1000m to 400m a
// process holding 2x250m is told to give back 100m; once it released one,
// nothing. The answer lists its own HOLD leases only, with their grants.
func TestLocalHoldListAfterShrink(t *testing.T) {
	e := shrinkEnv(t, nil)
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	c := l.Dial(t, e.Socket)
	c.SetDeadline(time.Now().Add(time.Minute))
	if ok := agenttest.HelloWith(t, c, slotv1.HelloFDPassing|slotv1.HelloLocal); ok.Flags&slotv1.HelloOKHoldList == 0 || ok.Flags&slotv1.HelloOKLocal == 0 {
		t.Fatalf("LOCAL and HOLD_LIST not announced: flags %b", ok.Flags)
	}
	var leases []*slotv1.AcquireOK
	for i := 0; i < 2; i++ {
		c.Write(agenttest.Frame(t, agenttest.HoldReq(250, 0)))
		m, _ := agenttest.ReadFDs(t, c)
		g, ok := m.(*slotv1.AcquireOK)
		if !ok {
			t.Fatalf("HOLD: %+v", m)
		}
		leases = append(leases, g)
	}
	other := agenttest.StartLive(t, e, e.Rel, 1)
	oc := agenttest.LocalConn(t, e.Socket, other)
	if h := askHoldList(t, oc); len(h.Leases) != 0 || h.GiveBackMilli != 0 {
		t.Fatalf("a process without HOLD leases: %+v", h)
	}
	h := askHoldList(t, c)
	if h.BudgetMilli != 1000 || h.GiveBackMilli != 0 || len(h.Leases) != 2 {
		t.Fatalf("within the budget: %+v", h)
	}
	for i, hl := range h.Leases {
		if hl.Lease != leases[i].Lease || hl.Slot != leases[i].Slot || hl.QuotaMilli != 250 || hl.Flags != 0 {
			t.Fatalf("lease %d: %+v, granted %+v", i, hl, leases[i])
		}
	}
	if err := setCPULimit(e, 400); err != nil {
		t.Fatal(err)
	}
	a.Maintain(time.Now())
	if h := askHoldList(t, c); h.BudgetMilli != 400 || h.GiveBackMilli != 100 {
		t.Fatalf("after the shrink to 400m: %+v, want give back 100m", h)
	}
	c.Write(agenttest.Frame(t, &slotv1.Release{Lease: leases[0].Lease}))
	if m, _ := agenttest.ReadFDs(t, c); !agenttest.IsReleaseOK(m) {
		t.Fatalf("release: %+v", m)
	}
	if h := askHoldList(t, c); h.GiveBackMilli != 0 || len(h.Leases) != 1 || a.Summaries()[0].UsedMilli != 250 {
		t.Fatalf("after giving one back: %+v, %+v", h, a.Summaries()[0])
	}
}

// TestAttackHoldList: HOLD_LIST on a connection not granted LOCAL, or with a
// payload, is BAD_REQUEST; a flood of HOLD_LIST is answered REJECTED past the
// per-process rate (counted as hold_list_throttled) while another process's
// HOLD_LIST is answered as usual.
func TestAttackHoldList(t *testing.T) {
	e := shrinkEnv(t, nil)
	a := e.Start()
	l := agenttest.StartLive(t, e, e.Rel, 1)
	plain := l.Dial(t, e.Socket)
	plain.SetDeadline(time.Now().Add(time.Minute))
	if ok := agenttest.HelloWith(t, plain, slotv1.HelloFDPassing); ok.Flags&(slotv1.HelloOKHoldList|slotv1.HelloOKLocal) != 0 {
		t.Fatalf("HOLD_LIST announced without LOCAL: %b", ok.Flags)
	}
	plain.Write(agenttest.Frame(t, &slotv1.HoldListRequest{}))
	m, _ := agenttest.ReadFDs(t, plain)
	agenttest.WantCode(t, "HOLD_LIST without LOCAL", m, slotv1.CodeBadRequest)

	c := agenttest.LocalConn(t, e.Socket, l)
	// HOLD_LIST with a byte of payload: the frame of HOLD_LIST plus one byte.
	b := agenttest.Frame(t, &slotv1.HoldListRequest{})
	b[3]++
	c.Write(append(b, 0))
	m, _ = agenttest.ReadFDs(t, c)
	agenttest.WantCode(t, "HOLD_LIST with a payload", m, slotv1.CodeBadRequest)

	const flood = 100
	var all []byte
	for i := 0; i < flood; i++ {
		all = append(all, agenttest.Frame(t, &slotv1.HoldListRequest{})...)
	}
	c.Write(all)
	answered, refused := 0, 0
	for i := 0; i < flood; i++ {
		switch m, _ := agenttest.ReadFDs(t, c); r := m.(type) {
		case *slotv1.HoldListOK:
			answered++
		case *slotv1.Error:
			if r.Code != slotv1.CodeRejected || r.RetryAfterMS == 0 {
				t.Fatalf("flood answer %d: %+v", i, r)
			}
			refused++
		default:
			t.Fatalf("flood answer %d: %+v", i, m)
		}
	}
	if refused == 0 || answered+refused != flood {
		t.Fatalf("%d HOLD_LIST back to back: %d answered, %d refused; want the rate to refuse some", flood, answered, refused)
	}
	other := agenttest.StartLive(t, e, e.Rel, 1)
	if h := askHoldList(t, agenttest.LocalConn(t, e.Socket, other)); h.GiveBackMilli != 0 {
		t.Fatalf("another process: %+v", h)
	}
	if v, ok := agenttest.MetricValue(agenttest.Scrape(t, a), `cpuslot_errors_total{reason="hold_list_throttled"}`); !ok || int(v) != refused {
		t.Fatalf("hold_list_throttled %v (%v), want %d", v, ok, refused)
	}
}

// TestLocalClientGiveBack: the Go client holds 2x250m with two threads
// invoking back to back; the limit shrinks to 400m. Within a bounded time
// the container's granted total fits 400m, with no help from idling: the
// client gives a held slot back because HOLD_LIST says so. Invocations go on
// throughout: every one granted runs in its slot, and none that ran in a
// slot is failed or moved; misses beyond the new budget wait for
// admission, as any request does.
func TestLocalClientGiveBack(t *testing.T) {
	e := shrinkEnv(t, nil)
	a := e.Start()
	cgrouptest.JoinProcess(t, e.H, e.Rel)
	c, err := client.Dial(e.Socket, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Hello().Flags&slotv1.HelloOKHoldList == 0 {
		t.Fatalf("HOLD_LIST not announced: %+v", c.Hello())
	}
	var stop atomic.Bool
	var ran, admission atomic.Int64
	var mu sync.Mutex
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	var wg sync.WaitGroup
	started := make(chan struct{}, 2)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			onLockedThread(func() {
				first := true
				for !stop.Load() {
					l, err := c.Acquire(250, "guest/giveback", "")
					if err != nil {
						if errors.Is(err, &slotv1.Error{Code: slotv1.CodeTimeout}) || errors.Is(err, &slotv1.Error{Code: slotv1.CodeRejected}) {
							admission.Add(1)
							continue
						}
						fail("acquire: %v", err)
						return
					}
					if first {
						started <- struct{}{}
						first = false
					}
					// A short invocation, checked in its slot at both ends.
					ok := l.Local && inSlot(e.H, e.Rel, l.Slot)
					for end := time.Now().Add(2 * time.Millisecond); time.Now().Before(end); {
					}
					ok = ok && inSlot(e.H, e.Rel, l.Slot)
					if !ok {
						fail("invocation not in its local slot %d", l.Slot)
					}
					if _, err := l.Release(slotv1.InvocationOK); err != nil {
						fail("release: %v", err)
					}
					ran.Add(1)
				}
			})
		}()
	}
	<-started
	<-started
	agenttest.WaitFor(t, "2x250m held", func() bool { return a.Summaries()[0].UsedMilli == 500 })
	if err := setCPULimit(e, 400); err != nil {
		t.Fatal(err)
	}
	a.Maintain(time.Now())
	if s := a.Summaries()[0]; s.BudgetMilli != 400 {
		t.Fatalf("budget after the shrink: %+v", s)
	}
	shrunk := time.Now()
	agenttest.WaitFor(t, "the granted total within the 400m budget", func() bool { return a.Summaries()[0].UsedMilli <= 400 })
	fit := time.Since(shrunk)
	before := ran.Load()
	agenttest.WaitFor(t, "invocations going on after the give-back", func() bool { return ran.Load() > before+50 })
	// It stays within: the client takes no slot beyond the new budget.
	for i := 0; i < 20; i++ {
		if s := a.Summaries()[0]; s.UsedMilli > 400 {
			t.Fatalf("granted %dm of 400m after the give-back", s.UsedMilli)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %s", len(failures), failures[0])
	}
	t.Logf("granted total fit the new budget %v after the shrink; %d invocations in slots, %d misses waited out admission", fit.Round(time.Millisecond), ran.Load(), admission.Load())
	if !strings.Contains(agenttest.Scrape(t, a), `cpuslot_errors_total{reason="hold_list_throttled"} 0`) {
		t.Errorf("the client was throttled:\n%s", agenttest.Grep(agenttest.Scrape(t, a), "hold_list_throttled"))
	}
}

// TestLocalClientDegradedRaised: the Go client's HOLD lease granted less
// than asked (policy degrade) is raised by the agent once budget frees; the
// client's table entry then says so (HOLD_LIST_OK carries the grant): its next
// invocation runs at the full quota, not degraded.
func TestLocalClientDegradedRaised(t *testing.T) {
	e := agenttest.LocalEnv(t, func(c *agent.Config) { c.Admission.Budget = "1"; c.Admission.Policy = "degrade" })
	e.Start()
	other := agenttest.StartLive(t, e, e.Rel, 1)
	oc := agenttest.LocalConn(t, e.Socket, other)
	oc.Write(agenttest.Frame(t, agenttest.HoldReq(800, 0)))
	m, _ := agenttest.ReadFDs(t, oc)
	big, ok := m.(*slotv1.AcquireOK)
	if !ok {
		t.Fatalf("HOLD 800m: %+v", m)
	}
	cgrouptest.JoinProcess(t, e.H, e.Rel)
	c, err := client.Dial(e.Socket, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var slot uint32
	onLockedThread(func() {
		l, err := c.Acquire(500, "guest/raised", "")
		if err != nil {
			t.Error(err)
			return
		}
		if !l.Local || !l.Degraded || l.QuotaMilli != 200 {
			t.Errorf("500m beside 800m of a 1000m budget: local %v degraded %v quota %d, want a degraded 200m", l.Local, l.Degraded, l.QuotaMilli)
		}
		slot = l.Slot
		l.Release(slotv1.InvocationOK)
	})
	if t.Failed() {
		return
	}
	oc.Write(agenttest.Frame(t, &slotv1.Release{Lease: big.Lease, Flags: slotv1.ReleaseNoReply}))
	agenttest.WaitFor(t, "the client's entry raised to 500m, not degraded", func() bool {
		for i := 0; i < c.Table().Cap(); i++ {
			if en := c.Table().Entry(i); en.Slot == slot {
				return en.QuotaMilli == 500 && en.Flags&slotv1.EntryDegraded == 0
			}
		}
		return false
	})
	onLockedThread(func() {
		l, err := c.Acquire(500, "guest/raised", "")
		if err != nil {
			t.Error(err)
			return
		}
		if l.Slot != slot || l.Degraded || l.QuotaMilli != 500 || !inSlot(e.H, e.Rel, l.Slot) {
			t.Errorf("after the raise: slot %d (was %d) degraded %v quota %d", l.Slot, slot, l.Degraded, l.QuotaMilli)
		}
		l.Release(slotv1.InvocationOK)
	})
}
