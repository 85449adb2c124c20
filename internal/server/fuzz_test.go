package server_test

// FuzzServer drives the whole agent with arbitrary client bytes: a live
// agent in this process, on the real kernel's cgroups, and a relay child
// (unprivileged, in the container, in a PID namespace of its own like a
// pod) that sends each input on a fresh connection. Every input goes
// through the decoder, the pool, the cgroups, the metrics and the encoder.
//
//	CPUSLOT_FUZZ_CRASH_OUTPUT=/tmp/fuzz-crash.txt \
//	go test ./internal/server -run '^$' -fuzz FuzzServer -fuzztime 10m -parallel 1 -timeout 0
//
// Fuzz workers run with their output discarded, and -test.timeout (10m by
// default) applies to each worker too: -timeout 0 keeps a long run from
// ending in "fuzzing process hung or terminated unexpectedly". With
// CPUSLOT_FUZZ_CRASH_OUTPUT set, a worker's crash (a panic in the agent)
// and the agent's errors go to that file.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
	"github.com/cpuslot/cpuslot/internal/discover"
)

// relayLease in a RELEASE or RECLAIM lease/slot field stands for the last
// lease (slot) granted on the connection, which a fuzzer cannot guess.
const relayLease = 0

func FuzzServer(f *testing.F) {
	hello := func(flags uint32) []byte {
		return agenttest.FrameBytes(&slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: flags, Client: "fuzz"})
	}
	cat := func(parts ...[]byte) []byte { return append([]byte{}, bytesJoin(parts)...) }
	acq := func(q uint32, tid uint32, flags uint8, action string) []byte {
		return agenttest.FrameBytes(&slotv1.Acquire{QuotaMilli: q, WaitUS: 1000, TID: tid, Flags: flags, Action: action, Invocation: "i"})
	}
	rel := func(flags uint8) []byte {
		return agenttest.FrameBytes(&slotv1.Release{Lease: relayLease, Flags: flags})
	}
	for _, mode := range []byte{0, 1} {
		f.Add(mode, hello(slotv1.HelloFDPassing))
		f.Add(mode, cat(hello(slotv1.HelloFDPassing), acq(250, 1, 0, "guest/fib"), rel(0)))
		f.Add(mode, cat(hello(0), acq(250, 1, slotv1.AcquireAgentPlaces, "a"), acq(500, 1, slotv1.AcquireAgentPlaces, "a"), rel(slotv1.ReleaseNoReply)))
		f.Add(mode, cat(hello(slotv1.HelloFDPassing), acq(1000, 1, 0, "b"), acq(250, 2, 0, "c"), rel(0), rel(0)))
		f.Add(mode, cat(hello(slotv1.HelloFDPassing), agenttest.FrameBytes(&slotv1.Reclaim{Slot: 1, QuotaMilli: 250, TID: 1, Action: "r"})))
		f.Add(mode, cat(hello(0), acq(10, 0, slotv1.AcquireAgentPlaces, "zero")))
		f.Add(mode, []byte{0, 1, 0, 0, 1, 1, 0, 0, 0, 1})
		// Local leasing: HOLD leases, USAGE reports, RECLAIM of a HOLD lease.
		hold := agenttest.FrameBytes(&slotv1.Acquire{QuotaMilli: 250, WaitUS: 1000, Flags: slotv1.AcquireHold})
		usage := agenttest.FrameBytes(&slotv1.Usage{Records: []slotv1.UsageRecord{
			{Action: "u", Outcome: slotv1.InvocationOK, Invocations: 2, CPUNanos: 5},
			{Action: "v", Outcome: slotv1.InvocationTimeout, Invocations: 1, ThrottledNanos: 7}}})
		local := hello(slotv1.HelloFDPassing | slotv1.HelloLocal)
		f.Add(mode, cat(local, hold, hold, usage, rel(slotv1.ReleaseNoReply), rel(0)))
		f.Add(mode, cat(local, hold, agenttest.FrameBytes(&slotv1.Reclaim{Slot: relayLease, QuotaMilli: 250}), usage, hold))
		f.Add(mode, cat(hello(slotv1.HelloFDPassing), usage, hold))
	}
	if p := os.Getenv("CPUSLOT_FUZZ_CRASH_OUTPUT"); p != "" && isFuzzWorker() {
		out, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			f.Fatal(err)
		}
		debug.SetCrashOutput(out, debug.CrashOptions{})
		os.Stderr = out // the agent's errors (testWriter) land here too
	}
	e := agenttest.NewEnv(f, 0, func(c *agent.Config) {
		c.Pool.Prewarm = "250m=2,500m=1"
		c.Pool.MaxSlots = 8
		c.Pool.MaxWait = agent.Duration{Duration: 20 * time.Millisecond}
		c.Admission.Budget = "1500m"
	})
	eager := e.Sibling("b")
	pc, err := e.Cfg.Settings()
	if err != nil {
		f.Fatal(err)
	}
	a := e.Start()
	eagerCfg := pc
	if err := eagerCfg.Set("pool.mode", "cache-eager"); err != nil { // the agent writes and moves TIDs
		f.Fatal(err)
	}
	if err := a.Prepare(discover.Container{Name: "eager", CgroupPath: eager, Pool: &eagerCfg}); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { a.Forget(eager) })
	relays := []*relay{startRelay(f, e, e.Rel), startRelay(f, e, eager)}
	execs := 0

	f.Fuzz(func(t *testing.T, mode byte, in []byte) {
		execs++
		r := relays[int(mode)%len(relays)]
		out, nfds, err := r.send(in)
		if err != nil {
			t.Fatalf("relay: %v", err)
		}
		// The input may have had the agent put the relay's threads in a
		// 10m slot; the next input starts with them out of every slot.
		r.unplace(t, e)
		// Every response is a whole, valid frame of a response type.
		for len(out) > 0 {
			if len(out) < 4 {
				t.Fatalf("%d stray bytes after the last response", len(out))
			}
			n := int(binary.BigEndian.Uint32(out))
			if n > len(out)-4 {
				t.Fatalf("response frame of %d bytes, %d left", n, len(out)-4)
			}
			fr, err := slotv1.DecodeBody(out[4 : 4+n])
			if err != nil {
				t.Fatalf("the agent sent a frame its own decoder refuses: %v", err)
			}
			switch m := fr.Msg.(type) {
			case *slotv1.HelloOK, *slotv1.ReleaseOK:
			case *slotv1.AcquireOK:
				nfds -= int(m.NumFDs)
			case *slotv1.Error:
				if m.Code == slotv1.CodeInternal {
					t.Fatalf("INTERNAL error: %s", m.Message)
				}
			default:
				t.Fatalf("the agent sent a %T", m)
			}
			out = out[4+n:]
		}
		if nfds != 0 {
			t.Fatalf("%d fds arrived that no response announced", nfds)
		}
		// The connection is gone: its leases end and the budget is whole.
		agenttest.WaitFor(t, "leases of a closed connection to end", func() bool {
			for _, s := range a.Summaries() {
				if s.Leases != 0 || s.UsedMilli != 0 {
					return false
				}
			}
			return true
		})
		for _, s := range a.Summaries() {
			n := 0
			for _, q := range s.Quotas {
				n += q.Slots
				if q.Free > q.Slots || q.Leased != 0 {
					t.Fatalf("pool %s inconsistent: %+v", s.Name, q)
				}
			}
			if n > 8 {
				t.Fatalf("pool %s holds %d slots, max 8", s.Name, n)
			}
		}
		if bad := agentThreadsInSlots(t, e.H); len(bad) > 0 {
			t.Fatalf("agent threads in slots: %v", bad)
		}
		rec := httptest.NewRecorder()
		a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if rec.Code != 200 {
			t.Fatalf("/metrics: %d %s", rec.Code, rec.Body.String())
		}
		if execs%1000 == 0 {
			t.Logf("%d execs in this worker", execs)
		}
	})
}

// isFuzzWorker tells a fuzz worker (whose output is discarded) from the
// coordinator (whose output is the progress report).
func isFuzzWorker() bool {
	f := flag.Lookup("test.fuzzworker")
	return f != nil && f.Value.String() == "true"
}

func bytesJoin(parts [][]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// relay is the child that talks to the agent for the fuzzer.
type relay struct {
	ch  *agenttest.Child
	in  io.Writer
	rel string
}

func startRelay(tb testing.TB, e *agenttest.Env, rel string) *relay {
	ch := agenttest.Spawn(tb, e.H, "relay", agenttest.ChildOpts{Cgroup: rel, Unprivileged: true, NewPIDNS: true, Env: []string{"SOCKET=" + e.Socket}})
	return &relay{ch: ch, in: ch.Stdin, rel: rel}
}

// unplace moves the relay's threads that sit in a slot back to its
// container's own cgroup.
func (r *relay) unplace(t *testing.T, e *agenttest.Env) {
	pid := r.ch.Cmd.Process.Pid
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, d := range tasks {
		tid, _ := strconv.Atoi(d.Name())
		if p, err := e.H.PathOfThread(pid, tid); err == nil && p != r.rel {
			if err := e.H.MoveThread(tid, r.rel); err != nil {
				t.Logf("moving relay thread %d out of %s: %v", tid, p, err)
			}
		}
	}
}

// send has the relay send in on a new connection and returns every byte
// the agent answered and the number of fds that came with them.
func (r *relay) send(in []byte) ([]byte, int, error) {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(in)))
	if _, err := r.in.Write(append(hdr[:], in...)); err != nil {
		return nil, 0, err
	}
	line, err := r.ch.Out.ReadString('\n')
	if err != nil {
		return nil, 0, fmt.Errorf("relay died: %v", err)
	}
	var nfds int
	var hexOut, problem string
	fmt.Sscanf(line, "%d %s %s", &nfds, &hexOut, &problem)
	if problem != "" && problem != "-" {
		return nil, 0, errors.New(strings.TrimSpace(line))
	}
	out := make([]byte, len(hexOut)/2)
	if hexOut == "-" {
		out = nil
	} else if _, err := fmt.Sscanf(hexOut, "%x", &out); err != nil {
		return nil, 0, err
	}
	return out, nfds, nil
}

// childRelay reads length-prefixed inputs on stdin; for each it opens a
// connection, sends the input frame by frame (reading the answer to each
// request that has one), closes its side, drains what is left and prints
// "<fds> <hex of all responses> <problem or ->".
func childRelay() (any, error) {
	// The main thread (TID 1 in the relay's PID namespace, the TID the
	// seeds ask the agent to place) stays idle: the relay's own work must
	// not crawl when an input puts that thread in a 10m slot.
	runtime.LockOSThread()
	done := make(chan error)
	go func() { done <- relayLoop() }()
	return nil, <-done
}

func relayLoop() error {
	in := bufio.NewReader(os.Stdin)
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(in, hdr[:]); err != nil {
			return nil
		}
		buf := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(in, buf); err != nil {
			return err
		}
		out, nfds, problem := relayOnce(os.Getenv("SOCKET"), buf)
		h := "-"
		if len(out) > 0 {
			h = fmt.Sprintf("%x", out)
		}
		if problem == "" {
			problem = "-"
		}
		fmt.Printf("%d %s %s\n", nfds, h, strings.ReplaceAll(problem, " ", "_"))
	}
}

func relayOnce(socket string, in []byte) (out []byte, nfds int, problem string) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, 0, "dial: " + err.Error()
	}
	defer c.Close()
	var lease uint64
	var slot uint32
	read := func() bool {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		body, fds, err := agenttest.ReadRawFrame(c)
		for _, fd := range fds {
			unix.Close(fd)
		}
		nfds += len(fds)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				problem = "no answer to a request within 20s"
			}
			return false
		}
		out = binary.BigEndian.AppendUint32(out, uint32(len(body)))
		out = append(out, body...)
		if f, err := slotv1.DecodeBody(body); err == nil {
			if g, ok := f.Msg.(*slotv1.AcquireOK); ok {
				lease, slot = g.Lease, g.Slot
			}
		}
		return true
	}
	for len(in) >= 4+slotv1.MinBodyLen {
		n := int(binary.BigEndian.Uint32(in))
		if n < slotv1.MinBodyLen || n > len(in)-4 {
			break
		}
		fr := append([]byte{}, in[:4+n]...)
		in = in[4+n:]
		body := fr[4:]
		answered := true
		switch body[1] {
		case slotv1.TypeRelease:
			if len(body) >= 16 && binary.BigEndian.Uint64(body[6:]) == relayLease {
				binary.BigEndian.PutUint64(body[6:], lease)
			}
			answered = !(len(body) == 16 && body[15]&slotv1.ReleaseNoReply != 0)
		case slotv1.TypeUsage:
			// One-way: only a refusal is answered, and the connection is
			// closed after it; the reads at the end collect it.
			answered = false
		case slotv1.TypeReclaim:
			if len(body) >= 10 && binary.BigEndian.Uint32(body[6:]) == relayLease {
				binary.BigEndian.PutUint32(body[6:], slot)
			}
		}
		if _, err := c.Write(fr); err != nil {
			return out, nfds, problem
		}
		if answered && !read() {
			return out, nfds, problem
		}
	}
	if len(in) > 0 {
		c.Write(in)
	}
	c.CloseWrite()
	for read() {
	}
	return out, nfds, problem
}
