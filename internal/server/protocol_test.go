package server_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
)

// Framing, request errors and sessions, against a live agent.

// TestBadInput sends malformed and invalid requests over a raw connection.
func TestBadInput(t *testing.T) {
	e := agenttest.NewEnv(t, 1000, nil)
	a := e.Start()
	cgrouptest.JoinProcess(t, e.H, e.Rel)

	// Requests before HELLO, garbage, oversized and truncated frames: a
	// typed error, then the connection is closed.
	for name, raw := range map[string][]byte{
		"acquire before hello": agenttest.Frame(t, &slotv1.Acquire{QuotaMilli: 250}),
		"unknown type":         {0, 0, 0, 6, 1, 0x55, 0, 0, 0, 1},
		"oversized":            {0, 1, 0, 1, 1, 1, 0, 0, 0, 1},
		"wrong version":        {0, 0, 0, 6, 9, 1, 0, 0, 0, 1},
	} {
		c := agenttest.DialRaw(t, e.Socket)
		c.Write(raw)
		resp := agenttest.ReadResp(t, c)
		pe, ok := resp.(*slotv1.Error)
		if !ok || (pe.Code != slotv1.CodeBadRequest && pe.Code != slotv1.CodeUnsupportedVersion) {
			t.Errorf("%s: got %+v", name, resp)
		}
		c.Close()
	}
	c := agenttest.DialRaw(t, e.Socket)
	c.Write([]byte{0, 0, 0, 40, 1, 2}) // a frame cut short by a disconnect
	c.Close()

	c = agenttest.DialRaw(t, e.Socket)
	defer c.Close()
	c.Write(agenttest.Frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: slotv1.HelloFDPassing}))
	if _, ok := agenttest.ReadResp(t, c).(*slotv1.HelloOK); !ok {
		t.Fatal("hello refused")
	}
	tid := uint32(syscall.Gettid())
	for q, want := range map[uint32]slotv1.Code{0: slotv1.CodeInvalidQuota, 5: slotv1.CodeInvalidQuota, 1500: slotv1.CodeInvalidQuota} {
		c.Write(agenttest.Frame(t, &slotv1.Acquire{QuotaMilli: q, TID: tid}))
		if pe, ok := agenttest.ReadResp(t, c).(*slotv1.Error); !ok || pe.Code != want {
			t.Errorf("quota %d: got %+v", q, pe)
		}
	}
	c.Write(agenttest.Frame(t, &slotv1.Release{Lease: 424242}))
	if pe, ok := agenttest.ReadResp(t, c).(*slotv1.Error); !ok || pe.Code != slotv1.CodeUnknownLease {
		t.Errorf("unknown lease: %+v", pe)
	}
	// The agent never places one of its own threads (here the peer is the
	// agent's own process).
	c.Write(agenttest.Frame(t, &slotv1.Acquire{QuotaMilli: 500, TID: tid, Flags: slotv1.AcquireAgentPlaces}))
	if pe, ok := agenttest.ReadResp(t, c).(*slotv1.Error); !ok || pe.Code != slotv1.CodeBadRequest {
		t.Errorf("agent placement of an agent thread: %+v", pe)
	}
	// The connection survives request-level errors: acquire, release twice.
	c.Write(agenttest.Frame(t, &slotv1.Acquire{QuotaMilli: 500, TID: tid}))
	g, ok := agenttest.ReadResp(t, c).(*slotv1.AcquireOK)
	if !ok || g.Place != slotv1.PlaceSelf {
		t.Fatalf("acquire: %+v", g)
	}
	c.Write(agenttest.Frame(t, &slotv1.Release{Lease: g.Lease}))
	if _, ok := agenttest.ReadResp(t, c).(*slotv1.ReleaseOK); !ok {
		t.Fatal("release failed")
	}
	c.Write(agenttest.Frame(t, &slotv1.Release{Lease: g.Lease}))
	if pe, ok := agenttest.ReadResp(t, c).(*slotv1.Error); !ok || pe.Code != slotv1.CodeUnknownLease {
		t.Errorf("double release: %+v", pe)
	}
	sum := a.Summaries()[0]
	if sum.Leases != 0 || sum.UsedMilli != 0 {
		t.Fatalf("pool inconsistent after bad input: %+v", sum)
	}
	// The frame cut short by a disconnect is counted by its connection's
	// own goroutine, whenever that one reads the end: wait for it.
	counted := func(body string) bool {
		return strings.Contains(body, `cpuslot_errors_total{reason="bad_frame"} 2`) && strings.Contains(body, `cpuslot_errors_total{reason="unknown_lease"} 2`)
	}
	body := agenttest.Scrape(t, a)
	for deadline := time.Now().Add(time.Minute); !counted(body) && time.Now().Before(deadline); body = agenttest.Scrape(t, a) {
		time.Sleep(5 * time.Millisecond)
	}
	if !counted(body) {
		t.Errorf("errors not counted within a minute:\n%s", agenttest.Grep(body, "cpuslot_errors_total"))
	}
}

// TestAbandonedLeases: a runtime that exits holding leases gets them
// released; the slots are free again.
func TestAbandonedLeases(t *testing.T) {
	e := agenttest.NewEnv(t, 0, nil)
	a := e.Start()
	ch := agenttest.Spawn(t, e.H, "hold", agenttest.ChildOpts{Cgroup: e.Rel, Env: []string{"SOCKET=" + e.Socket}})
	var r agenttest.AcquireResult
	ch.Result(t, &r)
	if r.Error != "" || r.Held != 2 {
		t.Fatalf("child: %+v", r)
	}
	if s := a.Summaries()[0]; s.Leases != 2 || s.UsedMilli != 750 {
		t.Fatalf("while held: %+v", s)
	}
	ch.Cmd.Process.Kill()
	ch.Cmd.Wait()
	agenttest.WaitFor(t, "abandoned leases released", func() bool { s := a.Summaries()[0]; return s.Leases == 0 && s.UsedMilli == 0 })
	if !strings.Contains(agenttest.Scrape(t, a), `outcome="abandoned",pod=""} 2`) {
		t.Error("abandoned leases not counted")
	}
}
