package agenttest

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"

	"github.com/cpuslot/cpuslot/client"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
	"golang.org/x/sys/unix"
)

// Child processes that act as runtimes, peers or an agent.

type AcquireResult struct {
	Error    string         `json:"error,omitempty"`
	Outcomes map[string]int `json:"outcomes,omitempty"`
	InSlot   int            `json:"inSlot"`
	OpenErr  string         `json:"openErr,omitempty"`
	Held     int            `json:"held,omitempty"`
}

func childAcquire() (any, error) {
	quota, _ := strconv.Atoi(os.Getenv("QUOTA"))
	n, _ := strconv.Atoi(os.Getenv("N"))
	c, err := client.Dial(os.Getenv("SOCKET"), client.Options{Name: "child"})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	runtime.LockOSThread()
	r := AcquireResult{Outcomes: map[string]int{}}
	for i := 0; i < n; i++ {
		l, err := c.Acquire(uint32(quota), "child", strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		r.Outcomes[l.Outcome.String()]++
		b, _ := os.ReadFile("/proc/thread-self/cgroup")
		if strings.Contains(string(b), "/"+cgroup.SlotName(l.Slot)+"\n") {
			r.InSlot++
		}
		if root := os.Getenv("SLOTFILE_ROOT"); root != "" && i == 0 {
			f, err := os.OpenFile(filepath.Join(root, cgroup.SlotName(l.Slot), "tasks"), os.O_WRONLY, 0)
			if errors.Is(err, os.ErrNotExist) {
				f, err = os.OpenFile(filepath.Join(root, cgroup.SlotName(l.Slot), "cgroup.threads"), os.O_WRONLY, 0)
			}
			if err != nil {
				r.OpenErr = err.Error()
			} else {
				f.Close()
				r.OpenErr = "opened"
			}
		}
		if _, err := l.Release(slotv1.InvocationOK); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func childHold() (any, error) {
	c, err := client.Dial(os.Getenv("SOCKET"), client.Options{})
	if err != nil {
		return nil, err
	}
	held := 0
	var wg sync.WaitGroup
	var errs [2]error
	for i, q := range []uint32{250, 500} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			_, errs[i] = c.Acquire(q, "hold", "")
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
		held++
	}
	// Report, then wait to be killed with the leases held. A read blocks in
	// the kernel: with its agent gone the child is not "deadlocked".
	fmt.Printf("{\"held\":%d}\n", held)
	io.Copy(io.Discard, os.Stdin)
	select {}
}

func childAgent() error {
	cfg := agent.DefaultConfig()
	cfg.Socket = os.Getenv("SOCKET")
	cfg.HTTP = ""
	cfg.Pool.Prewarm = "250m=2,500m=1"
	cfg.Standalone.Containers = []string{os.Getenv("CONTAINER")}
	// v1: fds (and so local leasing) also for a client in the test's own
	// PID namespace.
	cfg.Limits.HostNamespaceFDs = os.Getenv("HOST_NAMESPACE_FDS") == "1"
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, err := agent.New(cfg, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() { // StartAgentChild waits for this line
		for !a.Ready() {
			time.Sleep(5 * time.Millisecond)
		}
		fmt.Println(`{"ready":true}`)
	}()
	h := a.Hierarchy()
	return a.Run(ctx, []discover.Source{discover.Static{Hierarchy: h, Cgroups: cfg.Standalone.Containers}}, false)
}

// HexFrames encodes frames for the raw child, comma-separated.
func HexFrames(t *testing.T, ms ...slotv1.Message) string {
	var out []string
	for _, m := range ms {
		out = append(out, hex.EncodeToString(Frame(t, m)))
	}
	return strings.Join(out, ",")
}

// ReusePID gives the PID of a process that is gone to a new one: peer
// sets up what the test needs around a process (or thread) and ends it,
// returning its PID; the new process is mk's, started with that PID by
// setting the PID namespace's last PID just before the fork. Other tasks
// fork too, so it retries; when one of them took the PID and lives on
// (a thread the Go runtime started, on a loaded machine), that PID is lost
// and peer is asked for a new one.
func ReusePID(t *testing.T, peer func() int, mk func() *exec.Cmd) *exec.Cmd {
	t.Helper()
	for round := 0; round < 5; round++ {
		want := peer()
		cmd, holder := startWithPID(t, want, mk)
		if cmd != nil {
			return cmd
		}
		t.Logf("PID %d was taken by %s before the test's fork; a new peer", want, holder)
	}
	t.Fatal("the PID of a process that ended was taken by another task 5 times in a row")
	return nil
}

// startWithPID starts cmd with PID want; or it says who took want for
// good (nil cmd), or fails t after 200 tries.
func startWithPID(t *testing.T, want int, mk func() *exec.Cmd) (*exec.Cmd, string) {
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
			return cmd, ""
		}
		cmd.Process.Kill()
		cmd.Wait()
		if holder := taskOf(want); holder != "" {
			return nil, holder
		}
	}
	t.Fatalf("PID %d was never reused in 200 tries", want)
	return nil, ""
}

// taskOf names the live task with id tid ("" if none): its name and
// thread group.
func taskOf(tid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return ""
	}
	var name, tgid string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Name:\t"); ok {
			name = v
		} else if v, ok := strings.CutPrefix(l, "Tgid:\t"); ok {
			tgid = v
		}
	}
	return fmt.Sprintf("task %q of process %s", name, tgid)
}

// ConnectedByChild has a short-lived child in cgroup rel connect to the
// agent (and send frames), hands the connection to the test and exits: a
// socket inherited by another process after its opener is gone.
func ConnectedByChild(t *testing.T, e *Env, rel string, frames ...slotv1.Message) (*net.UnixConn, int) {
	t.Helper()
	cmd, pair := StartPaired(t, e, rel, unix.SOCK_STREAM, "CPUSLOT_CHILD=pass", "SOCKET="+e.Socket, "FRAMES="+HexFrames(t, frames...))
	defer pair.Close()
	pair.SetDeadline(time.Now().Add(30 * time.Second))
	c := ReceiveConn(t, pair, "child did not pass its connection")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	return c, cmd.Process.Pid
}

// StartPaired starts this test binary as a child (env says its role) in
// cgroup rel, with one end of a socket pair of sockType as its fd 3, and
// returns the other end.
func StartPaired(t *testing.T, e *Env, rel string, sockType int, env ...string) (*exec.Cmd, *net.UnixConn) {
	t.Helper()
	return StartPairedIn(t, e, rel, false, sockType, env...)
}

// StartPairedIn is startPaired, with the child in a PID namespace of its
// own (as in a pod) when newPIDNS.
func StartPairedIn(t *testing.T, e *Env, rel string, newPIDNS bool, sockType int, env ...string) (*exec.Cmd, *net.UnixConn) {
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
	cmd.Stderr = TestLog(t)
	if newPIDNS {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	}
	stdin, _ := cmd.StdinPipe()
	if err := e.H.StartIn(cmd, rel); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "go\n")
	pc, err := net.FileConn(mine)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, pc.(*net.UnixConn)
}

// ReceiveConn reads a message that passes one fd over pair and returns the
// fd as a connection, closed when the test ends; failing, it says why.
func ReceiveConn(t *testing.T, pair *net.UnixConn, why string) *net.UnixConn {
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
				if m, ok := f.Msg.(*slotv1.Acquire); ok && m.TID == SelfTID {
					m.TID = uint32(os.Getpid())
					b = FrameBytes(m)
				}
			}
			c.Write(b)
			if _, _, err := ReadRawFrame(c); err != nil {
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

// Sleeper makes a command that sleeps (a process to steer PIDs with).
func Sleeper(h *cgroup.Hierarchy, rel string) func() *exec.Cmd {
	return func() *exec.Cmd {
		// On v1 the sleeper is moved into rel by the caller after start.
		return exec.Command("sleep", "600")
	}
}

// SelfTID in a frame for the pass child stands for its own PID.
const SelfTID = 0xFFFFFFFF

// LiveChild is a separate process in a container that stays alive while
// the test uses its connections: the agent's peer is a live process that
// is not the agent, and TIDs are live threads of it.
type LiveChild struct {
	Pair *net.UnixConn
	PID  int
	TIDs []uint32
}

// StartLive starts a live child in cgroup rel with n threads that live as
// long as the child.
func StartLive(t *testing.T, e *Env, rel string, n int) *LiveChild {
	t.Helper()
	return StartLiveIn(t, e, rel, false, n)
}

// StartLiveIn is startLive, with the child in a PID namespace of its own
// when newPIDNS.
func StartLiveIn(t *testing.T, e *Env, rel string, newPIDNS bool, n int) *LiveChild {
	t.Helper()
	cmd, pair := StartPairedIn(t, e, rel, newPIDNS, unix.SOCK_SEQPACKET, "CPUSLOT_CHILD=live", "THREADS="+strconv.Itoa(n))
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	l := &LiveChild{Pair: pair, PID: cmd.Process.Pid}
	t.Cleanup(func() { l.Pair.Close() })
	l.Pair.SetDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 4096)
	m, err := l.Pair.Read(buf)
	if err != nil {
		t.Fatalf("live child did not start: %v", err)
	}
	if err := json.Unmarshal(buf[:m], &l.TIDs); err != nil || len(l.TIDs) != n {
		t.Fatalf("live child said %q: %v", buf[:m], err)
	}
	return l
}

// Dial has the live child connect to socket and hand the connection over;
// the child stays the peer.
func (l *LiveChild) Dial(t *testing.T, socket string) net.Conn {
	t.Helper()
	if _, err := l.Pair.Write([]byte(socket)); err != nil {
		t.Fatal(err)
	}
	return ReceiveConn(t, l.Pair, "live child could not connect")
}

// EndThread has the live child end its thread i (the process lives on).
func (l *LiveChild) EndThread(t *testing.T, i int) {
	t.Helper()
	if _, err := l.Pair.Write([]byte("end " + strconv.Itoa(i))); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := l.Pair.Read(buf); err != nil || string(buf[:n]) != "ended" {
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
