package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
)

// pidsRoot is the mount point of the v1 pids hierarchy, a hierarchy no
// slot fd reaches: the tests make their containers there too, as a
// container runtime does in every v1 hierarchy.
func pidsRoot(t *testing.T) string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Root != "/" {
			continue
		}
		for _, o := range strings.Split(m.VFSOptions, ",") {
			if o == "pids" {
				return m.Mountpoint
			}
		}
	}
	t.Skip("no v1 pids hierarchy")
	return ""
}

// alsoIn makes cgroup rel in the hierarchy mounted at root, removed when the
// test ends (after the processes the test starts later are gone), and
// returns a function that moves a process there.
func alsoIn(t *testing.T, root, rel string) func(pid int) {
	t.Helper()
	dir := filepath.Join(root, rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("removing %s: %v", dir, err)
		}
		// The parent goes with the last of its children.
		os.Remove(filepath.Dir(dir))
	})
	return func(pid int) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
}

type handFDsResult struct {
	Error string `json:"error,omitempty"`
	TID   int    `json:"tid"`
	Slot  uint32 `json:"slot"`
}

// childHandFDs is a runtime of container A that passes its slot's
// placement fds on: HELLO (fd passing), ACQUIRE, it places its own thread
// in the slot as a runtime does, then sends the placement fds over fd 3
// with its report, and waits to be killed.
func childHandFDs() (any, error) {
	runtime.LockOSThread()
	tid := syscall.Gettid()
	pair, err := net.FileConn(os.NewFile(3, "pair"))
	if err != nil {
		return nil, err
	}
	fail := func(err error) (any, error) {
		b, _ := json.Marshal(handFDsResult{Error: err.Error()})
		pair.(*net.UnixConn).WriteMsgUnix(b, nil, nil)
		return nil, err
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Getenv("SOCKET"), Net: "unix"})
	if err != nil {
		return fail(err)
	}
	c.Write(agenttest.FrameBytes(&slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: slotv1.HelloFDPassing}))
	if _, _, err := agenttest.ReadRawFrame(c); err != nil {
		return fail(fmt.Errorf("hello: %w", err))
	}
	c.Write(agenttest.FrameBytes(&slotv1.Acquire{QuotaMilli: 250, TID: uint32(tid)}))
	body, fds, err := agenttest.ReadRawFrame(c)
	if err != nil {
		return fail(fmt.Errorf("acquire: %w", err))
	}
	f, err := slotv1.DecodeBody(body)
	if err != nil {
		return fail(err)
	}
	ok, isOK := f.Msg.(*slotv1.AcquireOK)
	if !isOK || len(fds) < 2 {
		return fail(fmt.Errorf("acquire: %+v, %d fds", f.Msg, len(fds)))
	}
	place := fds[:len(fds)-2] // then cpu.stat and cpuacct.usage (v1)
	for _, fd := range place {
		if _, err := unix.Write(fd, []byte("0")); err != nil {
			return fail(fmt.Errorf("placing itself: %w", err))
		}
	}
	b, _ := json.Marshal(handFDsResult{TID: tid, Slot: ok.Slot})
	if _, _, err := pair.(*net.UnixConn).WriteMsgUnix(b, unix.UnixRights(place...), nil); err != nil {
		return fail(err)
	}
	time.Sleep(time.Hour)
	return nil, nil
}

// TestAttackSlotFDsHandedToAnotherContainer: a
// runtime of container A passes its slot's placement fds to a process of
// container B, which writes itself into A's slot: on cgroup v1 the kernel
// checks only who opened the fd. B's process then runs under A's slot
// limit and is billed to A. The agent's maintenance finds it (its cgroup
// in a hierarchy no slot fd reaches says it is B's), moves it back to B's
// cgroup, and counts it; A's own thread goes back to A's cgroup.
func TestAttackSlotFDsHandedToAnotherContainer(t *testing.T) {
	x := intrude(t)
	var seen []string
	for round := 1; round <= 3; round++ {
		x.a.Maintain(time.Now())
		p, err := x.e.H.PathOfPID(x.pid)
		seen = append(seen, fmt.Sprintf("round %d: %s (%v)", round, p, err))
		if p == x.b {
			break
		}
	}
	if p, _ := x.e.H.PathOfPID(x.pid); p != x.b {
		t.Fatalf("B's process was not moved back to %s:\n%s", x.b, strings.Join(seen, "\n"))
	}
	x.check(t)
	// The slot is retired (TestAttackLeakedSlotFDsDie): A's own thread
	// goes back to A's cgroup, nowhere else.
	agenttest.WaitFor(t, "A's own thread to go back to A's cgroup "+x.e.Rel, func() bool {
		p, err := x.e.H.PathOfThread(x.holder.cmd.Process.Pid, x.holder.res.TID)
		return err == nil && p == x.e.Rel
	})
	// Reported to the owners of both containers (Kubernetes: Events).
	got := x.reports.list()
	if len(got) != 2 || got[0].cg != x.e.Rel || got[1].cg != x.b ||
		!strings.Contains(got[0].msg, "moved back to "+x.b) || got[0].reason != discover.ReasonForeignThread {
		t.Errorf("reports: %+v", got)
	}
}

// reporter is a source that records what the agent reports.
type reporter struct {
	mu   sync.Mutex
	seen []report
}

type report struct{ cg, reason, msg string }

func (r *reporter) Run(context.Context, discover.Sink) error { return nil }

func (r *reporter) Report(cg, reason, msg string) {
	r.mu.Lock()
	r.seen = append(r.seen, report{cg, reason, msg})
	r.mu.Unlock()
}

func (r *reporter) list() []report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]report(nil), r.seen...)
}

// TestAttackForeignThreadLaunderedByRemoval: when A's slot is removed (A
// torn down, or an idle slot reaped) while B's process sits in it, the
// agent empties the slot. B's process must go back to B, not into A's own
// cgroup, where no slot scan would look and A's limit and bill stay on it.
func TestAttackForeignThreadLaunderedByRemoval(t *testing.T) {
	x := intrude(t)
	x.a.Forget(x.e.Rel)
	if p, err := x.e.H.PathOfPID(x.pid); p != x.b {
		t.Fatalf("B's process was moved to %s (%v) when A's slot was removed, want %s", p, err, x.b)
	}
	x.check(t)
}

// TestForeignScanTakesTurns: the scan's node-wide bound per round is
// shared by the containers in turns. With one thread per round, a
// container whose name comes first cannot keep the scan from reaching
// the next: B's process in A's slot is found within as many rounds as
// there are threads in the two containers' slots.
func TestForeignScanTakesTurns(t *testing.T) {
	defer agent.SetForeignScanBounds(1, 1)()
	var c string
	var intoC func(int)
	x := intrudeWith(t, func(e *agenttest.Env, pids string) {
		c = e.Sibling("a-first") // scanned first: its name sorts before A's
		e.Cfg.Standalone.Containers = append(e.Cfg.Standalone.Containers, c)
		intoC = alsoIn(t, pids, c)
	})
	startHandFDs(t, x.e, c, intoC) // C's own thread, in C's slot
	t.Cleanup(func() { x.a.Forget(c) })
	var seen []string
	rounds := 4 // C's thread, A's own and B's
	for r := 1; r <= rounds; r++ {
		x.a.Maintain(time.Now())
		p, err := x.e.H.PathOfPID(x.pid)
		seen = append(seen, fmt.Sprintf("round %d: %s (%v)", r, p, err))
		if p == x.b {
			break
		}
	}
	if p, _ := x.e.H.PathOfPID(x.pid); p != x.b {
		t.Fatalf("B's process was not found in %d rounds of one thread each:\n%s", rounds, strings.Join(seen, "\n"))
	}
	x.check(t)
}

// intrusion is B's process written into A's slot with A's fds.
type intrusion struct {
	e       *agenttest.Env
	a       *agent.Agent
	b, slot string
	pid     int
	holder  *handFDs
	reports *reporter
}

// intrude serves container A, whose runtime passes its slot's placement
// fds to a process of container B (a sibling cgroup, made in the pids
// hierarchy too, as container runtimes do), which writes itself into A's
// slot. Maintenance is left to the test.
func intrude(t *testing.T) *intrusion { return intrudeWith(t, nil) }

// intrudeWith is intrude with more to do before the agent starts.
func intrudeWith(t *testing.T, before func(e *agenttest.Env, pids string)) *intrusion {
	e := agenttest.NewEnv(t, 0, func(c *agent.Config) { c.Limits.HostNamespaceFDs = true })
	if e.H.Version == 2 {
		t.Skip("v2: the kernel refuses a thread from outside the threaded subtree (TestAttackPlacementFDOnForeignProcess)")
	}
	pids := pidsRoot(t)
	x := &intrusion{e: e, b: e.Sibling("b"), reports: &reporter{}}
	e.Sources = append(e.Sources, x.reports)
	intoA, intoB := alsoIn(t, pids, e.Rel), alsoIn(t, pids, x.b)
	if before != nil {
		before(e, pids)
	}
	x.a = e.Start()

	// A's runtime, with its slot's fds.
	x.holder = startHandFDs(t, e, e.Rel, intoA)
	// B's process takes them and writes itself into A's slot.
	intruder := exec.Command("sh", "-c", `read x; echo 0 >&3 && echo 0 >&4 && exec sleep 600`)
	intruder.ExtraFiles = x.holder.fds
	in, _ := intruder.StdinPipe()
	if err := e.H.StartIn(intruder, x.b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { intruder.Process.Kill(); intruder.Wait() })
	intoB(intruder.Process.Pid)
	io.WriteString(in, "go\n")
	x.slot = path.Join(e.Rel, cgroup.SlotName(x.holder.res.Slot))
	x.pid = intruder.Process.Pid
	agenttest.WaitFor(t, "B's process to write itself into A's slot", func() bool {
		return cgroupOf(t, x.pid, "cpuacct") == x.slot // its second write
	})
	return x
}

// check: B's process is back in B in both hierarchies a slot fd reaches,
// and counted.
func (x *intrusion) check(t *testing.T) {
	t.Helper()
	// The agent's every-second scan may be moving it meanwhile.
	agenttest.WaitFor(t, "B's process to be back in "+x.b+" in cpu and cpuacct", func() bool {
		return cgroupOf(t, x.pid, "cpu") == x.b && cgroupOf(t, x.pid, "cpuacct") == x.b
	})
	// It is counted after the move.
	agenttest.WaitFor(t, "the foreign thread to be counted", func() bool {
		return strings.Contains(agenttest.Scrape(t, x.a), `reason="foreign_thread_in_slot"} `)
	})
	if body := agenttest.Scrape(t, x.a); !strings.Contains(body, `reason="foreign_thread_in_slot"} 1`) {
		t.Errorf("the foreign thread was not counted once:\n%s", agenttest.Grep(body, "foreign_thread"))
	}
}

// cgroupOf reads the cgroup of a process in the v1 hierarchy of key.
func cgroupOf(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) == 3 {
			for _, k := range strings.Split(f[1], ",") {
				if k == key {
					return f[2]
				}
			}
		}
	}
	return ""
}

type handFDs struct {
	cmd *exec.Cmd
	fds []*os.File
	res handFDsResult
}

// startHandFDs starts the handfds child in container rel (moved into its
// other hierarchies by into) and receives its report and fds.
func startHandFDs(t *testing.T, e *agenttest.Env, rel string, into func(int)) *handFDs {
	t.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := os.NewFile(uintptr(sp[0]), "pair"), os.NewFile(uintptr(sp[1]), "pair")
	defer mine.Close()
	defer theirs.Close()
	exe, _ := os.Executable()
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "CPUSLOT_CHILD=handfds", "SOCKET="+e.Socket)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = agenttest.TestLog(t)
	stdin, _ := cmd.StdinPipe()
	if err := e.H.StartIn(cmd, rel); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	into(cmd.Process.Pid)
	io.WriteString(stdin, "go\n")
	pc, err := net.FileConn(mine)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	pc.SetDeadline(time.Now().Add(time.Minute))
	buf, oob := make([]byte, 512), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := pc.(*net.UnixConn).ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatalf("A's runtime passed nothing: %v", err)
	}
	h := &handFDs{cmd: cmd}
	if err := json.Unmarshal(buf[:n], &h.res); err != nil || h.res.Error != "" {
		t.Fatalf("A's runtime: %s (%v)", buf[:n], err)
	}
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	for _, m := range msgs {
		fds, _ := unix.ParseUnixRights(&m)
		for _, fd := range fds {
			f := os.NewFile(uintptr(fd), "slot")
			t.Cleanup(func() { f.Close() })
			h.fds = append(h.fds, f)
		}
	}
	if len(h.fds) != 2 {
		t.Fatalf("A's runtime passed %d placement fds, want 2 (cpu and cpuacct mounted apart)", len(h.fds))
	}
	return h
}

// TestAttackLeakedSlotFDsDie: once B's process is found in A's slot, the
// fds A passed on are useless. The slot's cgroup is removed as soon as
// A's lease ends (A's fd connections are closed, a HELLO-only one too, so
// it ends at once), so a write through a leaked fd fails, and A's
// clients are placed by the agent (AGENT_PLACES) for a while.
func TestAttackLeakedSlotFDsDie(t *testing.T) {
	x := intrude(t)
	live := agenttest.StartLive(t, x.e, x.e.Rel, 1)
	idle := live.Dial(t, x.e.Socket)
	idle.SetDeadline(time.Now().Add(time.Minute))
	if ok := agenttest.HelloWith(t, idle, slotv1.HelloFDPassing); ok.Flags&slotv1.HelloOKAgentPlaces != 0 {
		t.Fatalf("A's client refused fds before anything was found: flags %b", ok.Flags)
	}
	for round := 1; round <= 3; round++ {
		x.a.Maintain(time.Now())
		if p, _ := x.e.H.PathOfPID(x.pid); p == x.b {
			break
		}
	}
	x.check(t)
	if _, err := idle.Read(make([]byte, 64)); err != io.EOF {
		t.Errorf("A's idle fd connection: read %v, want it closed (EOF)", err)
	}
	// Writing B's process through the leaked fds must fail, in cpu and in
	// cpuacct.
	agenttest.WaitFor(t, "writes through the leaked fds to fail", func() bool {
		for _, f := range x.holder.fds {
			if _, err := unix.Write(int(f.Fd()), []byte(strconv.Itoa(x.pid))); err == nil {
				return false
			}
		}
		return true
	})
	if p, _ := x.e.H.PathOfPID(x.pid); p != x.b {
		t.Errorf("B's process is in %s after the writes, want %s", p, x.b)
	}
	again := live.Dial(t, x.e.Socket)
	again.SetDeadline(time.Now().Add(time.Minute))
	if ok := agenttest.HelloWith(t, again, slotv1.HelloFDPassing); ok.Flags&slotv1.HelloOKAgentPlaces == 0 {
		t.Errorf("A's client got fds again right after its fds were passed on: flags %b", ok.Flags)
	}
}

// TestForeignThreadFoundBetweenRounds: a slot leased now to a client that
// took its fds is scanned every second, not only in the maintenance
// round: B's process in A's leased slot is found by that scan alone.
func TestForeignThreadFoundBetweenRounds(t *testing.T) {
	x := intrude(t)
	x.a.ScanLeasedSlots()
	if p, err := x.e.H.PathOfPID(x.pid); p != x.b {
		t.Fatalf("B's process is in %s (%v) after the scan of leased slots, want %s", p, err, x.b)
	}
	x.check(t)
}
