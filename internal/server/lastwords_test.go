package server_test

import (
	"io"
	"math"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
)

// childLastWords is the child of TestLastWordsCounted: on a LOCAL
// connection it takes a HOLD lease, then sends at once an ACQUIRE that
// must wait (the HOLD lease has the whole budget) and a USAGE behind it,
// and exits when its stdin closes, without reading.
func childLastWords() (any, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Getenv("SOCKET"), Net: "unix"})
	if err != nil {
		return nil, err
	}
	call := func(m slotv1.Message) slotv1.Message {
		c.Write(agenttest.FrameBytes(m))
		return agenttest.ReadRespOrNil(c)
	}
	if ok, _ := call(&slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: slotv1.HelloFDPassing | slotv1.HelloLocal}).(*slotv1.HelloOK); ok == nil || ok.Flags&slotv1.HelloOKLocal == 0 {
		return nil, io.ErrUnexpectedEOF
	}
	if m := call(agenttest.HoldReq(250, 0)); !agenttest.IsAcquireOK(m) {
		return nil, io.ErrUnexpectedEOF
	}
	wait := agenttest.FrameBytes(&slotv1.Acquire{QuotaMilli: 250, TID: uint32(unix.Gettid()), WaitUS: math.MaxUint32})
	usage := agenttest.FrameBytes(&slotv1.Usage{Records: []slotv1.UsageRecord{
		{Action: "last", Outcome: slotv1.InvocationOK, Invocations: 1},
		// More CPU than its slot used: cut, also in last words.
		{Action: "greedy", Outcome: slotv1.InvocationOK, Invocations: 1, CPUNanos: 1 << 62}}})
	if _, err := c.Write(append(wait, usage...)); err != nil {
		return nil, err
	}
	io.Copy(io.Discard, os.Stdin)
	return map[string]int{}, nil
}

// TestLastWordsCounted: a process's last USAGE, sent before it exited, is
// counted once, even though the agent reads it only after it saw the
// process exit (and ended its session). The order is forced: the USAGE
// waits behind an ACQUIRE the agent holds until the exit ends the wait
// (CI once lost such a USAGE: TestHostileActionNamesPerContainer). What
// the report claims beyond what the process's slots used is still cut.
func TestLastWordsCounted(t *testing.T) {
	e := agenttest.LocalEnv(t, func(c *agent.Config) {
		c.Pool.Prewarm = "250m=1"
		c.Admission.Budget = "250m"
		c.Pool.MaxWait = agent.Duration{Duration: time.Hour} // only the process's exit ends the wait
	})
	a := e.Start()
	ch := agenttest.Spawn(t, e.H, "lastwords", agenttest.ChildOpts{Cgroup: e.Rel, Env: []string{"SOCKET=" + e.Socket}})
	value := func(series string) float64 {
		v, ok := agenttest.MetricValue(agenttest.Scrape(t, a), series)
		if !ok {
			return -1
		}
		return v
	}
	// The child exits once its ACQUIRE waits: its USAGE is still unread.
	agenttest.WaitFor(t, "the child's ACQUIRE to wait", func() bool { return value(`cpuslot_admission_total{result="queued"}`) == 1 })
	ch.Stdin.(io.Closer).Close()
	var r struct{ Error string }
	ch.Result(t, &r)
	if err := ch.Cmd.Wait(); err != nil || r.Error != "" {
		t.Fatalf("child: %v %s", err, r.Error)
	}
	// Its session ends (the HOLD lease released) once its connection is
	// done: only then is everything it sent read.
	agenttest.WaitFor(t, "the child's lease to end", func() bool { return a.Summaries()[0].Leases == 0 })
	last := `cpuslot_lease_releases_total{action="last",container="` + e.Rel + `",cpuslot_container="` + e.Rel + `",namespace="",outcome="ok",pod=""}`
	if n := value(last); n != 1 {
		t.Errorf("%s = %v, want 1 (-1: never counted)", last, n)
	}
	body := agenttest.Scrape(t, a)
	if greedy := agenttest.Grep(body, `action="greedy"`); strings.Contains(greedy, "cpu_seconds") && !strings.Contains(greedy, `cpu_seconds_total{action="greedy",container="`+e.Rel+`",cpuslot_container="`+e.Rel+`",namespace="",pod=""} 0`) {
		t.Errorf("a report claiming 2^62 ns was credited:\n%s", greedy)
	}
	if n := value(`cpuslot_errors_total{reason="usage_overclaimed"}`); n != 1 {
		t.Errorf("usage_overclaimed counted %v times, want 1", n)
	}
}
