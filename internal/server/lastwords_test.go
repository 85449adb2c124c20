package server

import (
	"encoding/binary"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/pool"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// sayLastWords is the child of TestLastWordsCounted: on a LOCAL
// connection it takes a HOLD lease, then sends at once an ACQUIRE that
// must wait (the HOLD lease has the whole budget) and a USAGE behind it,
// and exits when its stdin closes, without reading.
func sayLastWords(sock string) int {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return 1
	}
	call := func(m slotv1.Message) slotv1.Message {
		b, _ := slotv1.Append(nil, 1, m)
		c.Write(b)
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return nil
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(c, body); err != nil {
			return nil
		}
		f, err := slotv1.DecodeBody(body)
		if err != nil {
			return nil
		}
		return f.Msg
	}
	if ok, _ := call(&slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: slotv1.HelloFDPassing | slotv1.HelloLocal}).(*slotv1.HelloOK); ok == nil || ok.Flags&slotv1.HelloOKLocal == 0 {
		return 2
	}
	if _, ok := call(&slotv1.Acquire{QuotaMilli: 250, Flags: slotv1.AcquireHold}).(*slotv1.AcquireOK); !ok {
		return 3
	}
	wait, err := slotv1.Append(nil, 2, &slotv1.Acquire{QuotaMilli: 250, TID: uint32(unix.Gettid()), WaitUS: math.MaxUint32})
	if err != nil {
		return 4
	}
	usage, err := slotv1.Append(nil, 3, &slotv1.Usage{Records: []slotv1.UsageRecord{
		{Action: "last", Outcome: slotv1.InvocationOK, Invocations: 1},
		// More CPU than its slot used: cut, also in last words.
		{Action: "greedy", Outcome: slotv1.InvocationOK, Invocations: 1, CPUNanos: 1 << 62}}})
	if err != nil {
		return 5
	}
	if _, err := c.Write(append(wait, usage...)); err != nil {
		return 6
	}
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestLastWordsCounted: a process's last USAGE, sent before it exited, is
// counted once, even though the agent reads it only after it saw the
// process exit (and ended its session). The order is forced: the USAGE
// waits behind an ACQUIRE the agent holds until the exit ends the wait.
// What the report claims beyond what the process's slots used is still
// cut.
func TestLastWordsCounted(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	ctr, err := h.Container(rel, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := settings.Default()
	cfg.Prewarm = map[uint32]int{250: 1}
	cfg.BudgetMilli = 250
	cfg.MaxWait = math.MaxInt64 // only the process's exit ends the wait
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	p, err := pool.New(rel, cfg, pool.CgroupBackend(ctr), m)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	s := New(oneResolver{p}, h, m, slog.New(slog.DiscardHandler))
	l := DefaultLimits
	l.HostNamespaceFDs = true // LOCAL needs fds; on v1 a host peer gets them only so
	s.SetLimits(l)
	ln, err := Listen(filepath.Join(t.TempDir(), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { ln.Close(); s.Shutdown(); p.Close(true) })

	exe, _ := os.Executable()
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "CPUSLOT_TEST_LAST_WORDS="+ln.path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child exits once its ACQUIRE waits: its USAGE is still unread.
	for deadline := time.Now().Add(time.Minute); counter(t, reg, "cpuslot_admission_total", "result", "queued") < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("the child's ACQUIRE did not wait in a minute (child: %v); pool: %+v", cmd.Wait(), p.Summary())
		}
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	// Its session ends (the HOLD lease released) once its connection is
	// done: only then is everything it sent read.
	for deadline := time.Now().Add(time.Minute); p.Summary().Leases != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the child exited its lease is held: %+v", p.Summary())
		}
	}
	if n := counter(t, reg, "cpuslot_lease_releases_total", "action", "last"); n != 1 {
		t.Errorf("the last USAGE's invocation counted %v times, want 1 (-1: never)", n)
	}
	if cpu := counter(t, reg, "cpuslot_invocation_cpu_seconds_total", "action", "greedy"); cpu > 1 {
		t.Errorf("a report claiming 2^62 ns was credited %vs", cpu)
	}
	if n := counter(t, reg, "cpuslot_errors_total", "reason", "usage_overclaimed"); n != 1 {
		t.Errorf("usage_overclaimed counted %v times, want 1", n)
	}
}

// counter reads the counter name{labels} from reg (pairs of label name and
// value); -1 when it is not exported.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}
