package agent_test

// Attacks a hostile pod tries against the agent (docs/security.md). Each
// test is the attack; it passes when the attack fails.

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"github.com/cpuslot/cpuslot/internal/discover"
)

// rawAcquire encodes an ACQUIRE whose action is given as raw bytes: the
// encoder refuses strings that are not valid protocol strings, an attacker
// does not use the encoder.
func rawAcquire(t *testing.T, q, tid uint32, flags uint8, action []byte) []byte {
	t.Helper()
	ph := strings.Repeat("A", len(action))
	b := frame(t, &slotv1.Acquire{QuotaMilli: q, TID: tid, Flags: flags, Action: ph})
	i := strings.Index(string(b), ph)
	copy(b[i:], action)
	return b
}

func wantCode(t *testing.T, what string, m slotv1.Message, code slotv1.Code) {
	t.Helper()
	if pe, ok := m.(*slotv1.Error); !ok || pe.Code != code {
		t.Fatalf("%s: got %+v, want %v", what, m, code)
	}
}

// TestAttackInvalidStrings (issue: crash from one string): an action name
// that is not valid UTF-8, or holds control characters, is refused with
// BAD_REQUEST; the agent, its metrics and the connection live on.
func TestAttackInvalidStrings(t *testing.T) {
	e := newEnv(t, 0, nil)
	a := e.start()
	cgrouptest.JoinProcess(t, e.h, e.rel)
	c := dialRaw(t, e.socket)
	defer c.Close()
	c.Write(frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: slotv1.HelloFDPassing}))
	if _, ok := readResp(t, c).(*slotv1.HelloOK); !ok {
		t.Fatal("hello refused")
	}
	tid := uint32(syscall.Gettid())
	for _, action := range [][]byte{{'g', '/', 0xff}, []byte("a\nb"), {0xc2, 0x85}, {0xed, 0xa0, 0x80}} {
		c.Write(rawAcquire(t, 250, tid, 0, action))
		m := readResp(t, c)
		if g, ok := m.(*slotv1.AcquireOK); ok {
			// What the attacker does next: end the lease, which labels a metric.
			c.Write(frame(t, &slotv1.Release{Lease: g.Lease}))
			readResp(t, c)
		}
		wantCode(t, fmt.Sprintf("action %q", action), m, slotv1.CodeBadRequest)
	}
	c.Write(frame(t, &slotv1.Acquire{QuotaMilli: 250, TID: tid, Action: "ok"}))
	g, ok := readResp(t, c).(*slotv1.AcquireOK)
	if !ok {
		t.Fatal("a valid acquire after bad ones failed")
	}
	c.Write(frame(t, &slotv1.Release{Lease: g.Lease}))
	if _, ok := readResp(t, c).(*slotv1.ReleaseOK); !ok {
		t.Fatal("release failed")
	}
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `action="ok"`) {
		t.Fatalf("/metrics: %d\n%s", rec.Code, grep(rec.Body.String(), "lease_releases"))
	}
}

// TestAttackNonUTF8ContainerName: a container cgroup whose name is not
// valid UTF-8 does not break /metrics for the node.
func TestAttackNonUTF8ContainerName(t *testing.T) {
	e := newEnv(t, 0, nil)
	bad := filepath.Dir(e.rel) + "/bad\xff\x01name"
	for _, r := range []string{e.h.CPURoot, e.h.AcctRoot} {
		if r != "" {
			if err := os.MkdirAll(filepath.Join(r, bad), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.cfg.Standalone.Containers = append(e.cfg.Standalone.Containers, bad)
	a := e.start()
	t.Cleanup(func() { a.Forget(bad) })
	if len(a.Summaries()) != 2 {
		t.Fatalf("pools: %+v", a.Summaries())
	}
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "bad\uFFFD?name") {
		t.Fatalf("/metrics: %d\n%s", rec.Code, grep(rec.Body.String(), "cpuslot_slots"))
	}
}

// agentThreadsInSlots lists this process's threads (the agent runs in the
// test process) that sit in a slot.
func agentThreadsInSlots(t *testing.T, h *cgroup.Hierarchy) []string {
	t.Helper()
	tasks, _ := os.ReadDir("/proc/self/task")
	var bad []string
	for _, d := range tasks {
		tid, _ := strconv.Atoi(d.Name())
		p, err := h.PathOfThread(os.Getpid(), tid)
		if err == nil && strings.Contains(p, "/"+cgroup.SlotPrefix) {
			bad = append(bad, fmt.Sprintf("%d in %s", tid, p))
		}
	}
	return bad
}

// TestAttackAgentPlacesItself (issue: the agent captures itself): ACQUIREs
// with tid 0 and the agent-places flag, in parallel, must not move any
// agent thread into the pod's slot.
func TestAttackAgentPlacesItself(t *testing.T) {
	e := newEnv(t, 0, func(c *agent.Config) { c.Pool.Prewarm = "10m=8" })
	e.start()
	ch := spawn(t, e.h, "raw", childOpts{cgroup: e.rel, unprivileged: true, env: []string{
		"SOCKET=" + e.socket, "PARALLEL=6", "FRAMES=" + hexFrames(t,
			&slotv1.Hello{MinVersion: 1, MaxVersion: 1},
			&slotv1.Acquire{QuotaMilli: 10, TID: 0, Flags: slotv1.AcquireAgentPlaces},
			&slotv1.Acquire{QuotaMilli: 10, TID: uint32(os.Getpid()), Flags: slotv1.AcquireAgentPlaces},
			&slotv1.Acquire{QuotaMilli: 10, TID: uint32(syscall.Gettid()), Flags: slotv1.AcquireAgentPlaces})}})
	var r rawResult
	ch.result(t, &r)
	t.Logf("child: %+v", r)
	if bad := agentThreadsInSlots(t, e.h); len(bad) > 0 {
		t.Fatalf("agent threads moved into slots: %v", bad)
	}
	for _, resp := range r.Responses {
		if strings.HasPrefix(resp, "ACQUIRE_OK") {
			t.Fatalf("an acquisition for a thread that is not the peer's was granted: %v", r.Responses)
		}
	}
}

// hexFrames encodes frames for the raw child, comma-separated.
func hexFrames(t *testing.T, ms ...slotv1.Message) string {
	var out []string
	for _, m := range ms {
		out = append(out, hex.EncodeToString(frame(t, m)))
	}
	return strings.Join(out, ",")
}

type rawResult struct {
	Error     string   `json:"error,omitempty"`
	Responses []string `json:"responses"`
	PID       int      `json:"pid,omitempty"`
	TID       int      `json:"tid,omitempty"`
	WriteErr  string   `json:"writeErr,omitempty"`
	FDs       int      `json:"fds,omitempty"`
}

// childRaw sends FRAMES on PARALLEL connections (default 1), reading one
// response per frame, and reports what came back. With VICTIM set it
// writes that PID to every placement fd it receives.
func childRaw() (any, error) {
	runtime.LockOSThread()
	n, _ := strconv.Atoi(os.Getenv("PARALLEL"))
	n = max(n, 1)
	type out struct {
		resp []string
		werr string
		fds  int
		err  error
	}
	ch := make(chan out, n)
	for i := 0; i < n; i++ {
		go func() {
			var o out
			o.resp, o.werr, o.fds, o.err = rawSession(os.Getenv("SOCKET"), os.Getenv("FRAMES"), os.Getenv("VICTIM"))
			ch <- o
		}()
	}
	r := rawResult{PID: os.Getpid(), TID: syscall.Gettid()}
	for i := 0; i < n; i++ {
		o := <-ch
		if o.err != nil {
			return nil, o.err
		}
		r.Responses = append(r.Responses, o.resp...)
		if o.werr != "" {
			r.WriteErr = o.werr
		}
		r.FDs += o.fds
	}
	return r, nil
}

func rawSession(socket, frames, victim string) (resp []string, werr string, nfds int, err error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, "", 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	for _, h := range strings.Split(frames, ",") {
		b, _ := hex.DecodeString(h)
		if _, err := c.Write(b); err != nil {
			return append(resp, "write: "+err.Error()), werr, nfds, nil
		}
		body, fds, err := readRawFrame(c)
		if err != nil {
			return append(resp, "read: "+err.Error()), werr, nfds, nil
		}
		nfds += len(fds)
		for i, fd := range fds {
			if victim != "" && i == 0 {
				if _, err := unix.Write(fd, []byte(victim)); err != nil {
					werr = err.Error()
				} else {
					werr = "written"
				}
			}
			unix.Close(fd)
		}
		f, err := slotv1.DecodeBody(body)
		if err != nil {
			return append(resp, "decode: "+err.Error()), werr, nfds, nil
		}
		switch m := f.Msg.(type) {
		case *slotv1.Error:
			resp = append(resp, "ERROR "+m.Code.String()+": "+m.Message)
		case *slotv1.HelloOK:
			resp = append(resp, fmt.Sprintf("HELLO_OK container=%s flags=%d", m.Container, m.Flags))
		case *slotv1.AcquireOK:
			resp = append(resp, fmt.Sprintf("ACQUIRE_OK slot=%d place=%d nfds=%d", m.Slot, m.Place, m.NumFDs))
		default:
			resp = append(resp, fmt.Sprintf("%T", m))
		}
	}
	return resp, werr, nfds, nil
}

// readRawFrame reads one frame and any fds that came with it.
func readRawFrame(c *net.UnixConn) ([]byte, []int, error) {
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(8*4))
	n, oobn, _, _, err := c.ReadMsgUnix(hdr[:1], oob)
	if err != nil || n == 0 {
		return nil, nil, errors.Join(err, io.ErrUnexpectedEOF)
	}
	var fds []int
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			f, _ := unix.ParseUnixRights(&m)
			fds = append(fds, f...)
		}
	}
	if _, err := io.ReadFull(c, hdr[1:]); err != nil {
		return nil, fds, err
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	_, err = io.ReadFull(c, body)
	return body, fds, err
}

// startWithPID starts cmd so that it gets PID want, by setting the PID
// namespace's last PID just before the fork. Other processes fork too, so
// it retries; the caller checks what it got.
func startWithPID(t *testing.T, want int, mk func() *exec.Cmd) *exec.Cmd {
	t.Helper()
	for try := 0; try < 200; try++ {
		cmd := mk()
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(want-1)), 0); err != nil {
			t.Skipf("cannot steer PIDs: %v", err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.Process.Pid == want {
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			return cmd
		}
		cmd.Process.Kill()
		cmd.Wait()
	}
	t.Fatalf("PID %d was never reused in 200 tries", want)
	return nil
}

// connectedByChild has a short-lived child in cgroup rel connect to the
// agent (and send frames), hands the connection to the test and exits: a
// socket inherited by another process after its opener is gone.
func connectedByChild(t *testing.T, e *env, rel string, frames ...slotv1.Message) (*net.UnixConn, int) {
	t.Helper()
	cmd, pair := startPaired(t, e, rel, unix.SOCK_STREAM, "CPUSLOT_CHILD=pass", "SOCKET="+e.socket, "FRAMES="+hexFrames(t, frames...))
	defer pair.Close()
	pair.SetDeadline(time.Now().Add(30 * time.Second))
	c := receiveConn(t, pair, "child did not pass its connection")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	return c, cmd.Process.Pid
}

// startPaired starts this test binary as a child (env says its role) in
// cgroup rel, with one end of a socket pair of sockType as its fd 3, and
// returns the other end.
func startPaired(t *testing.T, e *env, rel string, sockType int, env ...string) (*exec.Cmd, *net.UnixConn) {
	t.Helper()
	return startPairedIn(t, e, rel, false, sockType, env...)
}

// startPairedIn is startPaired, with the child in a PID namespace of its
// own (as in a pod) when newPIDNS.
func startPairedIn(t *testing.T, e *env, rel string, newPIDNS bool, sockType int, env ...string) (*exec.Cmd, *net.UnixConn) {
	t.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, sockType, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine := os.NewFile(uintptr(sp[0]), "pair")
	theirs := os.NewFile(uintptr(sp[1]), "pair")
	defer mine.Close()
	defer theirs.Close()
	exe, _ := os.Executable()
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = testWriter{t}
	if newPIDNS {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	}
	stdin, _ := cmd.StdinPipe()
	if err := e.h.StartIn(cmd, rel); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "go\n")
	pc, err := net.FileConn(mine)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, pc.(*net.UnixConn)
}

// receiveConn reads a message that passes one fd over pair and returns the
// fd as a connection, closed when the test ends; failing, it says why.
func receiveConn(t *testing.T, pair *net.UnixConn, why string) *net.UnixConn {
	t.Helper()
	oob := make([]byte, unix.CmsgSpace(4))
	buf := make([]byte, 512)
	n, oobn, _, _, err := pair.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatalf("%s: %v", why, err)
	}
	if oobn == 0 {
		t.Fatalf("%s: %s", why, buf[:n])
	}
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	fds, _ := unix.ParseUnixRights(&msgs[0])
	f := os.NewFile(uintptr(fds[0]), "agent")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.UnixConn)
}

// childPass connects, sends FRAMES (reading a response to each), passes the
// connection over fd 3 and exits.
func childPass() (any, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Getenv("SOCKET"), Net: "unix"})
	if err != nil {
		return nil, err
	}
	if fr := os.Getenv("FRAMES"); fr != "" {
		for _, h := range strings.Split(fr, ",") {
			b, _ := hex.DecodeString(h)
			if f, err := slotv1.DecodeBody(b[4:]); err == nil {
				if m, ok := f.Msg.(*slotv1.Acquire); ok && m.TID == selfTID {
					m.TID = uint32(os.Getpid())
					b = frameBytes(m)
				}
			}
			c.Write(b)
			if _, _, err := readRawFrame(c); err != nil {
				return nil, err
			}
		}
	}
	f, _ := c.File()
	pair := os.NewFile(3, "pair")
	pc, err := net.FileConn(pair)
	if err != nil {
		return nil, err
	}
	_, _, err = pc.(*net.UnixConn).WriteMsgUnix([]byte{1}, unix.UnixRights(int(f.Fd())), nil)
	return map[string]int{}, err
}

func sleeper(h *cgroup.Hierarchy, rel string) func() *exec.Cmd {
	return func() *exec.Cmd {
		// On v1 the sleeper is moved into rel by the caller after start.
		return exec.Command("sleep", "600")
	}
}

// TestAttackPIDReuseAtHello (issue: identity races): a connection opened
// by a process of A, whose PID is then reused by a process in B, must not
// be served B's pool.
func TestAttackPIDReuseAtHello(t *testing.T) {
	e := newEnv(t, 0, nil)
	b := e.sibling("b")
	e.cfg.Standalone.Containers = []string{e.rel, b}
	a := e.start()
	t.Cleanup(func() { a.Forget(b) })
	c, pid := connectedByChild(t, e, e.rel)
	q := startWithPID(t, pid, sleeper(e.h, b))
	if err := e.h.MoveProcess(q.Process.Pid, b); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write(frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: slotv1.HelloFDPassing}))
	body, fds, err := readRawFrame(c)
	for _, fd := range fds {
		unix.Close(fd)
	}
	if err != nil {
		return // closed: refused
	}
	f, err := slotv1.DecodeBody(body)
	if err != nil {
		t.Fatal(err)
	}
	if ok, isOK := f.Msg.(*slotv1.HelloOK); isOK {
		t.Fatalf("a dead peer's connection was served container %s (its PID now belongs to a process there)", ok.Container)
	}
	wantCode(t, "hello", f.Msg, slotv1.CodeNotServed)
}

// TestAttackPIDReuseAgentPlaces: after HELLO, the peer exits and its PID
// goes to a process of B; an agent placement of that PID must not move it
// into A's slot.
func TestAttackPIDReuseAgentPlaces(t *testing.T) {
	e := newEnv(t, 0, nil)
	b := e.sibling("b")
	e.cfg.Standalone.Containers = []string{e.rel, b}
	a := e.start()
	t.Cleanup(func() { a.Forget(b) })
	c, pid := connectedByChild(t, e, e.rel, &slotv1.Hello{MinVersion: 1, MaxVersion: 1})
	q := startWithPID(t, pid, sleeper(e.h, b))
	if err := e.h.MoveProcess(q.Process.Pid, b); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write(frame(t, &slotv1.Acquire{QuotaMilli: 250, TID: uint32(pid), Flags: slotv1.AcquireAgentPlaces}))
	readRawFrame(c)
	if p, err := e.h.PathOfPID(pid); err != nil || p != b {
		t.Fatalf("process of B is now in %s (%v)", p, err)
	}
}

// TestAttackEagerReleaseReusedTID: in cache-eager mode the end of a lease
// moves its thread out of the slot. When the thread has exited and its TID
// went to a process of B, B's process must stay where it is. The pool
// sees that the TID names another thread (start time) and counts it as
// stale_tid; behind it, cgroup.Container.MoveOut moves only a thread that
// sits in one of the container's slots (internal/cgroup tests). (The
// process lives on: a process that exits ends its leases at once.)
func TestAttackEagerReleaseReusedTID(t *testing.T) {
	e := newEnv(t, 0, func(c *agent.Config) { c.Pool.Mode = "cache-eager" })
	b := e.sibling("b")
	e.cfg.Standalone.Containers = []string{e.rel, b}
	a := e.start()
	t.Cleanup(func() { a.Forget(b) })
	l := startLive(t, e, e.rel, 1)
	c := l.dial(t, e.socket)
	c.SetDeadline(time.Now().Add(time.Minute))
	sayHello(t, c)
	c.Write(frame(t, &slotv1.Acquire{QuotaMilli: 250, TID: l.tids[0], Flags: slotv1.AcquireAgentPlaces}))
	if m := readResp(t, c); !isAcquireOK(m) {
		t.Fatalf("acquire: %+v", m)
	}
	tid := int(l.tids[0])
	l.endThread(t, 0)
	if s := a.Summaries(); s[0].Leases+s[1].Leases != 1 {
		t.Fatalf("the child's lease is not held: %+v", s)
	}
	// Start times count clock ticks (1/100 s): a TID reused within the tick
	// its first owner started in cannot be told apart by start time (a
	// residual risk, docs/security.md); then only MoveOut's check that the
	// thread sits in one of the container's slots protects B. Reuse it in
	// a later tick, to test what the agent can detect.
	time.Sleep(30 * time.Millisecond)
	q := startWithPID(t, tid, sleeper(e.h, b))
	if err := e.h.MoveProcess(q.Process.Pid, b); err != nil {
		t.Fatal(err)
	}
	c.Close() // the lease is abandoned: the agent releases it
	waitFor(t, "the lease to end", func() bool { s := a.Summaries(); return s[0].Leases+s[1].Leases == 0 })
	if p, err := e.h.PathOfPID(q.Process.Pid); err != nil || p != b {
		t.Fatalf("process of B moved to %s (%v)", p, err)
	}
	if body := scrape(t, a); !strings.Contains(body, `reason="stale_tid"} 1`) {
		t.Errorf("the reused TID was not counted as stale:\n%s", grep(body, "stale_tid"))
	}
}

// selfTID in a frame for the pass child stands for its own PID.
const selfTID = 0xFFFFFFFF

func frameBytes(m slotv1.Message) []byte {
	b, err := slotv1.Append(nil, 1, m)
	if err != nil {
		panic(err)
	}
	return b
}

// TestAttackPlacementFDOnForeignProcess (issue: what a v1 fd grants): a
// process that got a slot's placement fd writes the PID of a root process
// of another container into it. On v1 the agent passes no placement fds to
// a peer in the host's PID namespace; on v2 the kernel refuses a thread
// outside the container's threaded subtree. Either way the victim stays.
func TestAttackPlacementFDOnForeignProcess(t *testing.T) {
	e := newEnv(t, 0, nil)
	b := e.sibling("b")
	e.start()
	victim := exec.Command("sleep", "600")
	if err := e.h.StartIn(victim, b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { victim.Process.Kill(); victim.Wait() })
	ch := spawn(t, e.h, "raw", childOpts{cgroup: e.rel, unprivileged: true, env: []string{
		"SOCKET=" + e.socket, "VICTIM=" + strconv.Itoa(victim.Process.Pid), "FRAMES=" + hexFrames(t,
			&slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: slotv1.HelloFDPassing},
			&slotv1.Acquire{QuotaMilli: 250, TID: 1})}})
	var r rawResult
	ch.result(t, &r)
	t.Logf("child: %+v", r)
	if p, err := e.h.PathOfPID(victim.Process.Pid); err != nil || p != b {
		t.Fatalf("victim moved to %s (%v) through a passed fd", p, err)
	}
	if e.h.Version == 2 && r.FDs == 0 {
		t.Fatalf("v2: no fds passed, the kernel check was not exercised: %+v", r)
	}
	if e.h.Version == 2 && r.WriteErr == "written" {
		t.Fatalf("v2: the kernel accepted a foreign thread")
	}
}

// TestPodGetsPlacementFDs: a peer in its own PID namespace (a pod) gets
// placement fds on v1 and places its threads itself.
func TestPodGetsPlacementFDs(t *testing.T) {
	e := newEnv(t, 0, nil)
	e.start()
	ch := spawn(t, e.h, "acquire", childOpts{cgroup: e.rel, unprivileged: true, newPIDNS: true, env: []string{
		"SOCKET=" + e.socket, "QUOTA=250", "N=5"}})
	var r acquireResult
	ch.result(t, &r)
	if r.Error != "" || r.InSlot != 5 {
		t.Fatalf("child: %+v", r)
	}
	if r.Outcomes["affinity_hit"] < 4 {
		t.Fatalf("outcomes %v", r.Outcomes)
	}
}

// closedByAgent tells a read that ended because the agent closed the
// connection (EOF, or a reset when unread data was left) from a timeout.
func closedByAgent(err error) bool {
	return err == nil || errors.Is(err, syscall.ECONNRESET)
}

// TestAttackConnectionsPerProcess (issue: node-wide DoS): a process in no
// served container opens many connections and stalls. Past the
// per-process cap they are closed at once; a frame longer than any HELLO
// is refused before it is buffered; the container is still served.
func TestAttackConnectionsPerProcess(t *testing.T) {
	const limit, n = 8, 40
	e := newEnv(t, 0, func(c *agent.Config) { c.Limits.MaxConnectionsPerProcess = limit })
	a := e.start()
	var conns []net.Conn
	for i := 0; i < n; i++ {
		c, err := net.Dial("unix", e.socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	// The agent closes n-limit of them; the others wait for their HELLO.
	closed := map[int]bool{}
	waitFor(t, "connections past the per-process cap to be closed", func() bool {
		for i, c := range conns {
			if closed[i] {
				continue
			}
			c.SetReadDeadline(time.Now().Add(time.Millisecond))
			var b [1]byte
			if _, err := c.Read(b[:]); closedByAgent(err) || errors.Is(err, io.EOF) {
				closed[i] = true
			}
		}
		return len(closed) >= n-limit
	})
	if body := scrape(t, a); !strings.Contains(body, fmt.Sprintf(`cpuslot_errors_total{reason="connection_limit"} %d`, n-limit)) {
		t.Errorf("refused connections not counted:\n%s", grep(body, "cpuslot_errors_total"))
	}
	// An open one announces a 64 KiB frame: refused at once.
	for i, c := range conns {
		if closed[i] {
			continue
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		c.Write([]byte{0, 1, 0, 0, 1, 1})
		wantCode(t, "64 KiB frame before HELLO", readResp(t, c), slotv1.CodeBadRequest)
		break
	}
	cgrouptest.JoinProcess(t, e.h, e.rel)
	// The refused connection's place under the cap frees when the agent
	// has torn it down, which may be just after its error arrived here: a
	// HELLO is answered once it has (a busy machine showed the gap).
	waitFor(t, "a HELLO answered while the flood's connections stay open", func() bool {
		c := dialRaw(t, e.socket)
		defer c.Close()
		c.Write(frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1}))
		_, ok := readRespOrNil(c).(*slotv1.HelloOK)
		return ok
	})
}

// TestAttackStalls: a connection that never says HELLO, and one that
// stops inside a frame after HELLO, are closed.
func TestAttackStalls(t *testing.T) {
	e := newEnv(t, 0, func(c *agent.Config) {
		c.Limits.HelloTimeout = agent.Duration{Duration: 200 * time.Millisecond}
		c.Limits.FrameTimeout = agent.Duration{Duration: 200 * time.Millisecond}
	})
	e.start()
	silent := dialRaw(t, e.socket)
	defer silent.Close()
	silent.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadAll(silent); !closedByAgent(err) {
		t.Fatalf("silent connection not closed: %v", err)
	}
	cgrouptest.JoinProcess(t, e.h, e.rel)
	c := dialRaw(t, e.socket)
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	c.Write(frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1}))
	if _, ok := readResp(t, c).(*slotv1.HelloOK); !ok {
		t.Fatal("hello refused")
	}
	c.Write([]byte{0, 0, 0, 40, 1})
	if _, err := io.ReadAll(c); !closedByAgent(err) {
		t.Fatalf("stalled frame after HELLO not closed: %v", err)
	}
}

// TestAttackContainerConnectionCap: past a served container's own share of
// connections its new connections are closed at once, and served again
// once others close.
func TestAttackContainerConnectionCap(t *testing.T) {
	e := newEnv(t, 0, func(c *agent.Config) { c.Limits.MaxConnectionsPerContainer = 4 })
	e.start()
	cgrouptest.JoinProcess(t, e.h, e.rel)
	var held []net.Conn
	for i := 0; i < 4; i++ {
		c := dialRaw(t, e.socket)
		c.Write(frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1}))
		if _, ok := readResp(t, c).(*slotv1.HelloOK); !ok {
			t.Fatal("hello refused")
		}
		held = append(held, c)
	}
	c := dialRaw(t, e.socket)
	c.Write(frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1}))
	if _, err := io.ReadAll(c); !closedByAgent(err) {
		t.Fatalf("connection past the cap not closed: %v", err)
	}
	held[0].Close()
	waitFor(t, "a connection slot to free", func() bool {
		c := dialRaw(t, e.socket)
		defer c.Close()
		c.Write(frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1}))
		var hdr [4]byte
		_, err := io.ReadFull(c, hdr[:])
		return err == nil
	})
	for _, c := range held[1:] {
		c.Close()
	}
}

// TestAttackSymlinkedSocket (issue: chmod follows a symlink): a pod plants
// a symlink where its socket goes. The agent refuses that pod's socket
// with an error, changes nothing the link points to, and keeps running.
func TestAttackSymlinkedSocket(t *testing.T) {
	e := newEnv(t, 0, nil)
	a := e.start()
	podDir := worldDir(t)
	target := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(target, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(podDir, "agent.sock")
	if err := os.Symlink(target, sock); err != nil {
		t.Fatal(err)
	}
	other := filepath.Dir(e.rel) + "/pod"
	for _, r := range []string{e.h.CPURoot, e.h.AcctRoot} {
		if r != "" {
			os.MkdirAll(filepath.Join(r, other), 0o755)
		}
	}
	err := a.Prepare(discover.Container{Name: "ns/pod/c", CgroupPath: other, Socket: sock})
	t.Cleanup(func() { a.Forget(other) })
	if err == nil {
		t.Fatal("served a socket at a planted symlink")
	}
	if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("symlink target changed: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Lstat(sock); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the pod's file was replaced: %v", err)
	}
	if !a.Ready() {
		t.Fatal("agent stopped")
	}
	if len(a.Summaries()) != 1 {
		t.Fatalf("pools: %+v", a.Summaries())
	}
}

// TestAttackPeerThatDoesNotRead: a peer pipelines requests and never reads
// the answers. Once the socket's buffers are full the agent's write would
// block for ever; it gives up after the frame timeout and closes.
func TestAttackPeerThatDoesNotRead(t *testing.T) {
	e := newEnv(t, 0, func(c *agent.Config) {
		c.Limits.FrameTimeout = agent.Duration{Duration: 200 * time.Millisecond}
	})
	a := e.start()
	cgrouptest.JoinProcess(t, e.h, e.rel)
	c := dialRaw(t, e.socket)
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	c.Write(frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1}))
	readResp(t, c)
	// Unknown message types: each is answered with an error and the
	// connection stays open.
	junk := []byte{0, 0, 0, 6, 1, 0x55, 0, 0, 0, 1}
	go func() {
		b := make([]byte, 0, len(junk)*4096)
		for i := 0; i < 4096; i++ {
			b = append(b, junk...)
		}
		for {
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	waitFor(t, "the agent to drop a peer that does not read", func() bool {
		return strings.Contains(scrape(t, a), "\ncpuslot_connections 0\n")
	})
}

// liveChild is a separate process in a container that stays alive while
// the test uses its connections: the agent's peer is a live process that
// is not the agent, and tids are live threads of it.
type liveChild struct {
	pair *net.UnixConn
	pid  int
	tids []uint32
}

// startLive starts a live child in cgroup rel with n threads that live as
// long as the child.
func startLive(t *testing.T, e *env, rel string, n int) *liveChild {
	t.Helper()
	return startLiveIn(t, e, rel, false, n)
}

// startLiveIn is startLive, with the child in a PID namespace of its own
// when newPIDNS.
func startLiveIn(t *testing.T, e *env, rel string, newPIDNS bool, n int) *liveChild {
	t.Helper()
	cmd, pair := startPairedIn(t, e, rel, newPIDNS, unix.SOCK_SEQPACKET, "CPUSLOT_CHILD=live", "THREADS="+strconv.Itoa(n))
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	l := &liveChild{pair: pair, pid: cmd.Process.Pid}
	t.Cleanup(func() { l.pair.Close() })
	l.pair.SetDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 4096)
	m, err := l.pair.Read(buf)
	if err != nil {
		t.Fatalf("live child did not start: %v", err)
	}
	if err := json.Unmarshal(buf[:m], &l.tids); err != nil || len(l.tids) != n {
		t.Fatalf("live child said %q: %v", buf[:m], err)
	}
	return l
}

// dial has the live child connect to socket and hand the connection over;
// the child stays the peer.
func (l *liveChild) dial(t *testing.T, socket string) net.Conn {
	t.Helper()
	if _, err := l.pair.Write([]byte(socket)); err != nil {
		t.Fatal(err)
	}
	return receiveConn(t, l.pair, "live child could not connect")
}

// endThread has the live child end its thread i (the process lives on).
func (l *liveChild) endThread(t *testing.T, i int) {
	t.Helper()
	if _, err := l.pair.Write([]byte("end " + strconv.Itoa(i))); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := l.pair.Read(buf); err != nil || string(buf[:n]) != "ended" {
		t.Fatalf("live child did not end thread %d: %q %v", i, buf[:n], err)
	}
}

// childLive starts THREADS threads that live until it exits (or the test
// ends one), says their ids, then connects to each socket the test names
// and passes the connection back, until the test closes the pair.
func childLive() (any, error) {
	// The main thread stays this goroutine's: a thread the test may end is
	// never the main thread (the runtime parks that one instead of ending it).
	runtime.LockOSThread()
	n, _ := strconv.Atoi(os.Getenv("THREADS"))
	tids := make([]int, n)
	end := make([]chan chan struct{}, n)
	for i := range tids {
		ch := make(chan int)
		end[i] = make(chan chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			ch <- syscall.Gettid()
			done := <-end[i]
			// The thread exits when the goroutine returns locked to it;
			// say so only once it is gone.
			tid := syscall.Gettid()
			go func() {
				for unix.Tgkill(os.Getpid(), tid, 0) == nil {
					time.Sleep(time.Millisecond)
				}
				close(done)
			}()
		}()
		tids[i] = <-ch
	}
	pc, err := net.FileConn(os.NewFile(3, "pair"))
	if err != nil {
		return nil, err
	}
	pair := pc.(*net.UnixConn)
	b, _ := json.Marshal(tids)
	if _, err := pair.Write(b); err != nil {
		return nil, err
	}
	buf := make([]byte, 4096)
	for {
		m, err := pair.Read(buf)
		if err != nil || m == 0 {
			return map[string]int{}, nil // the test is done
		}
		if i, ok := strings.CutPrefix(string(buf[:m]), "end "); ok {
			n, _ := strconv.Atoi(i)
			done := make(chan struct{})
			end[n] <- done
			<-done
			pair.Write([]byte("ended"))
			continue
		}
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: string(buf[:m]), Net: "unix"})
		if err != nil {
			pair.Write([]byte(err.Error()))
			continue
		}
		f, _ := c.File()
		_, _, err = pair.WriteMsgUnix([]byte{1}, unix.UnixRights(int(f.Fd())), nil)
		f.Close()
		c.Close()
		if err != nil {
			return nil, err
		}
	}
}

// TestAttackPlacementPreparesNoPool: under serve-under, a peer served
// container A moves itself to another cgroup below the served root and
// asks the agent to place a thread. The placement is refused (the peer
// left its container), and the request must not make the agent prepare a
// pool (slot directories, budget, fds) for the cgroup the peer moved to.
func TestAttackPlacementPreparesNoPool(t *testing.T) {
	e := newEnv(t, 0, nil)
	e.serveUnder()
	relB := e.sibling("moved")
	a := e.start()
	t.Cleanup(func() { a.Forget(relB) })
	l := startLive(t, e, e.rel, 1)
	c := l.dial(t, e.socket)
	c.SetDeadline(time.Now().Add(time.Minute))
	sayHello(t, c)
	pools := len(a.Summaries())
	if err := e.h.MoveProcess(l.pid, relB); err != nil {
		t.Fatal(err)
	}
	c.Write(frame(t, &slotv1.Acquire{QuotaMilli: 250, TID: l.tids[0], Flags: slotv1.AcquireAgentPlaces}))
	resp := readResp(t, c)
	if _, ok := resp.(*slotv1.AcquireOK); ok {
		t.Fatalf("a peer that left its container had a thread placed: %+v", resp)
	}
	if n := len(a.Summaries()); n != pools {
		t.Errorf("the placement request made the agent prepare a pool: %d pools, was %d", n, pools)
	}
	if left := cgrouptest.Leftovers(e.h, relB); len(left) != 0 {
		t.Errorf("slot directories made in the cgroup the peer moved to: %v", left)
	}
}

// TestAttackDebugPoolsFromPodNetwork (issue 19, finding 6): /debug/pools
// lists every served container with its budget; the agent's HTTP port may
// be open on the pod network for /metrics. A peer that is not on loopback
// gets 403 for /debug/pools (and nothing of it), while /metrics and the
// probes answer it; debugPoolsRemote serves /debug/pools to it.
func TestAttackDebugPoolsFromPodNetwork(t *testing.T) {
	get := func(a *agent.Agent, path, remote string) (int, string) {
		req := httptest.NewRequest("GET", path, nil)
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		a.Handler().ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	e := newEnv(t, 0, nil)
	a := e.start()
	for _, remote := range []string{"10.244.1.7:40312", "[fd00::7]:40312", "192.0.2.1:1", "[::ffff:10.0.0.1]:80", "garbage"} {
		if code, body := get(a, "/debug/pools", remote); code != 403 || strings.Contains(body, e.rel) {
			t.Errorf("/debug/pools from %s: %d %q, want 403 and no container", remote, code, body)
		}
		for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
			if code, _ := get(a, path, remote); code != 200 {
				t.Errorf("%s from %s: %d, want 200", path, remote, code)
			}
		}
	}
	for _, remote := range []string{"127.0.0.1:40312", "127.3.4.5:1", "[::1]:40312", "[::ffff:127.0.0.1]:9"} {
		if code, body := get(a, "/debug/pools", remote); code != 200 || !strings.Contains(body, e.rel) {
			t.Errorf("/debug/pools from %s: %d %q, want 200 with %s", remote, code, body, e.rel)
		}
	}
	e.stop()
	e.stop = nil

	e = newEnv(t, 0, func(c *agent.Config) { c.DebugPoolsRemote = true })
	a = e.start()
	if code, body := get(a, "/debug/pools", "10.244.1.7:40312"); code != 200 || !strings.Contains(body, e.rel) {
		t.Errorf("/debug/pools from the pod network with debugPoolsRemote: %d %q", code, body)
	}
}

// TestAttackNestedNamespaceFDs (issue 19, finding 1): a process of a
// served container that lives in the host's PID namespace forks a child
// into a new user and PID namespace (no privilege needed) and has it ask
// for placement fds. On v1 such a fd could be handed back to the parent,
// which names every process of the node. The child must get AGENT_PLACES
// and no fd: its namespace is not the one that holds all of its
// container's processes.
func TestAttackNestedNamespaceFDs(t *testing.T) {
	e := newEnv(t, 0, nil)
	e.start()
	if e.h.Version == 2 {
		t.Skip("v2: placement fds are bounded by the kernel")
	}
	ch := spawn(t, e.h, "nested", childOpts{cgroup: e.rel, unprivileged: true, env: []string{
		"SOCKET=" + e.socket, "FRAMES=" + hexFrames(t,
			&slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: slotv1.HelloFDPassing},
			&slotv1.Acquire{QuotaMilli: 250, TID: 1})}})
	var r rawResult
	ch.result(t, &r)
	t.Logf("nested child: %+v", r)
	if r.Error != "" || len(r.Responses) == 0 {
		t.Fatalf("nested child: %+v", r)
	}
	if r.FDs != 0 {
		t.Fatalf("a namespace nested in a host-namespace container got %d placement fds: %v", r.FDs, r.Responses)
	}
	if !strings.Contains(r.Responses[0], fmt.Sprintf("flags=%d", slotv1.HelloOKAgentPlaces)) {
		t.Fatalf("HELLO_OK without AGENT_PLACES: %v", r.Responses)
	}
}

// childNested stays in the caller's PID namespace and runs the raw child
// in a new user and PID namespace, as an unprivileged process can.
func childNested() (any, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "CPUSLOT_CHILD=raw")
	cmd.Stdin = strings.NewReader("go\n")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nested child: %w (%s)", err, out)
	}
	var r rawResult
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("nested child said %q: %w", out, err)
	}
	return r, nil
}

// TestAttackPreHelloFlood (issue 19, finding 2): processes of an
// unprivileged user outside every served container each hold idle
// connections without HELLO until the node cap is full. A process of a
// served container must still have its HELLO answered: each served
// container has its own share.
func TestAttackPreHelloFlood(t *testing.T) {
	const nodeCap, floods, perFlood = 32, 4, 16
	e := newEnv(t, 0, func(c *agent.Config) {
		c.Limits.MaxConnections = nodeCap
		// The flood's connections stay until the test ends, however slow
		// the machine is to start the flooders.
		c.Limits.HelloTimeout = agent.Duration{Duration: time.Hour}
	})
	a := e.start()
	for i := 0; i < floods; i++ {
		ch := spawn(t, e.h, "idle", childOpts{unprivileged: true, env: []string{
			"SOCKET=" + e.socket, "CONNS=" + strconv.Itoa(perFlood)}})
		var r map[string]int
		ch.result(t, &r)
		if r["opened"] != perFlood {
			t.Fatalf("flood %d: %v", i, r)
		}
	}
	waitFor(t, "the flood to fill the node cap", func() bool {
		v, _ := metricValue(scrape(t, a), `cpuslot_errors_total{reason="connection_limit"}`)
		return v > 0
	})
	cgrouptest.JoinProcess(t, e.h, e.rel)
	answered := 0
	for i := 0; i < 10; i++ {
		c := dialRaw(t, e.socket)
		c.SetDeadline(time.Now().Add(time.Minute))
		c.Write(frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1}))
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err == nil {
			answered++
		}
		c.Close()
	}
	if answered != 10 {
		t.Fatalf("a served container's process got %d of 10 HELLOs answered while the node cap was full", answered)
	}
}

// childIdle opens CONNS connections to SOCKET, says nothing on them, and
// keeps them until the test ends (its stdin closes).
func childIdle() (any, error) {
	n, _ := strconv.Atoi(os.Getenv("CONNS"))
	var conns []net.Conn
	for i := 0; i < n; i++ {
		c, err := net.Dial("unix", os.Getenv("SOCKET"))
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
	}
	b, _ := json.Marshal(map[string]int{"opened": len(conns)})
	fmt.Println(string(b))
	io.Copy(io.Discard, os.Stdin)
	return map[string]int{}, nil
}

// TestAttackFDsAfterHostProcessJoins (issue 19, finding 1): a pod-like
// peer holds a fd connection; then a process in the host's PID namespace
// joins its container (as a runtime's exec into a host-namespace container
// would). The peer's namespace no longer holds the whole container, so its
// next ACQUIRE after the recheck interval (1 s) closes the connection
// (fds_revoked), and a new HELLO gets AGENT_PLACES.
func TestAttackFDsAfterHostProcessJoins(t *testing.T) {
	e := newEnv(t, 0, nil)
	a := e.start()
	if e.h.Version == 2 {
		t.Skip("v2: placement fds are bounded by the kernel")
	}
	l := startLiveIn(t, e, e.rel, true, 1)
	hello := func(c net.Conn) *slotv1.HelloOK {
		c.Write(frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: slotv1.HelloFDPassing}))
		ok, isOK := readResp(t, c).(*slotv1.HelloOK)
		if !isOK {
			t.Fatal("hello refused")
		}
		return ok
	}
	c := l.dial(t, e.socket)
	c.SetDeadline(time.Now().Add(time.Minute))
	if ok := hello(c); ok.Flags&slotv1.HelloOKAgentPlaces != 0 {
		t.Fatalf("a peer whose namespace holds its container got AGENT_PLACES: %+v", ok)
	}
	host := exec.Command("sleep", "1000")
	if err := e.h.StartIn(host, e.rel); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Process.Kill(); host.Wait() })
	time.Sleep(1100 * time.Millisecond) // the recheck interval, and a little
	c.Write(frame(t, &slotv1.Acquire{QuotaMilli: 250, TID: uint32(l.tids[0])}))
	if _, err := io.ReadAll(c); !closedByAgent(err) {
		t.Fatalf("the fd connection was not closed once a host process joined the container: %v", err)
	}
	if v, _ := metricValue(scrape(t, a), `cpuslot_errors_total{reason="fds_revoked"}`); v != 1 {
		t.Fatalf("fds_revoked = %v, want 1", v)
	}
	c2 := l.dial(t, e.socket)
	c2.SetDeadline(time.Now().Add(time.Minute))
	if ok := hello(c2); ok.Flags&slotv1.HelloOKAgentPlaces == 0 {
		t.Fatalf("a new HELLO got fds while a host process is in the container: %+v", ok)
	}
}
