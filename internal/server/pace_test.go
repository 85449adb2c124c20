package server

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/pool"
)

// countingResolver serves no one (HELLO is answered NOT_SERVED) and counts,
// per cgroup, the peers the accept loop took on: past its buckets, it asks
// which container a peer's cgroup is in.
type countingResolver struct {
	mu   sync.Mutex
	read map[string]int
}

func (r *countingResolver) Resolve(Peer) (*pool.Pool, error)    { return nil, &NotServed{Reason: "test"} }
func (r *countingResolver) Holds(Peer, *pool.Pool) bool         { return false }
func (r *countingResolver) Processes(*pool.Pool) ([]int, error) { return nil, nil }
func (r *countingResolver) Serving(cg string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.read[cg]++
	return ""
}

func (r *countingResolver) reads(cg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.read[cg]
}

// churnConnects is how many connects the churning child makes.
const churnConnects = 3000

// churn is the churning child: once a line arrives on stdin (it has been
// moved to its cgroup), it connects to sock and closes again, without
// blocking, until churnConnects went through or a minute passed, and
// reports how many went through and how many were refused. It lives on
// until stdin closes: the agent may not have taken its last connections
// yet, and the cgroup of a process that has exited reads as the root, so
// they would be charged to the root cgroup's bucket.
func churn(sock string) int {
	in := bufio.NewReader(os.Stdin)
	in.ReadString('\n')
	defer io.Copy(io.Discard, in)
	addr := &unix.SockaddrUnix{Name: sock}
	n := map[string]int{}
	for end := time.Now().Add(time.Minute); n["connects"] < churnConnects && time.Now().Before(end); {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return 1
		}
		if unix.Connect(fd, addr) == nil {
			n["connects"]++
		} else {
			n["refused"]++
		}
		unix.Close(fd)
	}
	json.NewEncoder(os.Stdout).Encode(n)
	return 0
}

// churnRig is an agent serving a shared socket and a container's own,
// and the churning children run against them.
type churnRig struct {
	t     *testing.T
	h     *cgroup.Hierarchy
	s     *Server
	reg   *prometheus.Registry
	dir   string
	child string
}

// newChurnRig starts an agent with limits l resolving peers of its shared
// socket with r.
func newChurnRig(t *testing.T, h *cgroup.Hierarchy, l Limits, r Resolver) *churnRig {
	reg := prometheus.NewRegistry()
	s := New(r, h, metrics.New(reg), slog.New(slog.DiscardHandler))
	s.SetLimits(l)
	// The churner may be nobody: it must reach the sockets and the binary.
	dir := t.TempDir()
	for p := dir; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o755)
	}
	t.Cleanup(s.Shutdown)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	child := filepath.Join(dir, "child")
	if err := os.WriteFile(child, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return &churnRig{t: t, h: h, s: s, reg: reg, dir: dir, child: child}
}

// listen serves a socket named name with serve until the test ends.
func (g *churnRig) listen(name string, serve func(*Listener) error) string {
	t := g.t
	ln, err := Listen(filepath.Join(g.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serve(ln) }()
	t.Cleanup(func() { ln.Close(); <-done })
	return filepath.Join(g.dir, name)
}

// hello connects to sock (a full backlog refuses a connect with EAGAIN: a
// client tries again) and fails the test unless its HELLO is answered.
func (g *churnRig) hello(sock, what string) {
	t := g.t
	t.Helper()
	b, err := slotv1.Append(nil, 1, &slotv1.Hello{MinVersion: 1, MaxVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	var c net.Conn
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		if c, err = net.Dial("unix", sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no connect to %s within a minute: %v", what, filepath.Base(sock), err)
		}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	c.Write(b)
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatalf("%s: HELLO not answered on %s: %v", what, filepath.Base(sock), err)
	}
}

// churner starts a churning process of user uid in cgroup rel against
// sock; it churns once started, and its result comes once it is done.
func (g *churnRig) churner(sock string, uid int, rel string) (start func(), result <-chan map[string]int) {
	t := g.t
	cmd := exec.Command(g.child, "-test.run=^$")
	cmd.Env = append(os.Environ(), "CPUSLOT_TEST_CHURN="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: 65534}}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for _, root := range []string{g.h.CPURoot, g.h.AcctRoot} {
		if root == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(root, rel, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	res := make(chan map[string]int, 1)
	go func() {
		var r map[string]int
		json.NewDecoder(out).Decode(&r)
		res <- r
	}()
	return func() { io.WriteString(in, "go\n") }, res
}

// TestAttackReconnectChurn: processes of other
// users, in a cgroup of their own, connect and close again as fast as they
// can: three users on the shared socket, where each user's bucket closes
// its connections before their cgroup is read and the cgroup's bucket
// closes those of all three past its own, and one on a container's own
// socket, which stops accepting while its bucket is empty. The agent takes
// on at most acceptBurst + acceptRate x the time taken of the cgroup's
// connections on each, while the test's own process (another user and
// cgroup) has every HELLO answered on the shared socket. Watched failing
// with pacing taken out (one user on the shared socket then): of 3000
// connects the agent had taken on 1237 on the shared socket (at most 28
// allowed) and 814 on the container's (at most 22) by the time the test
// looked; and with the cgroup's bucket taken out, three users took on 62
// on the shared socket (at most 26).
func TestAttackReconnectChurn(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	const rate, burst = 20, 20
	l := DefaultLimits
	l.AcceptRate, l.AcceptBurst = rate, burst
	l.SharedAcceptRate = 1 << 30 // the shared socket's own bucket is another matter
	shared, own := &countingResolver{read: map[string]int{}}, &countingResolver{read: map[string]int{}}
	g := newChurnRig(t, h, l, shared)
	sharedSock := g.listen("shared.sock", g.s.Serve)
	ownSock := g.listen("own.sock", func(ln *Listener) error { return g.s.ServeWith(ln, own) })

	// On the shared socket three users of one cgroup churn: each within
	// its user's bucket, together past their cgroup's.
	for _, sock := range []string{sharedSock, ownSock} {
		resolver, uids := shared, []int{65534, 65533, 65532}
		if sock == ownSock {
			resolver, uids = own, uids[:1]
		}
		var starts []func()
		var results []<-chan map[string]int
		for _, uid := range uids {
			start, res := g.churner(sock, uid, rel)
			starts = append(starts, start)
			results = append(results, res)
		}
		start := time.Now()
		for _, go_ := range starts {
			go_()
		}
		// Served meanwhile, on the shared socket.
		for i := 0; i < 5; i++ {
			g.hello(sharedSock, fmt.Sprintf("HELLO %d during the churn on %s", i, filepath.Base(sock)))
		}
		connects := 0
		for _, res := range results {
			select {
			case r := <-res:
				connects += r["connects"]
			case <-time.After(2 * time.Minute):
				t.Fatalf("a churner on %s did not report within 2 minutes", filepath.Base(sock))
			}
		}
		if sock == sharedSock {
			// The queue is first in, first out: once this is answered,
			// every churned connection before it was taken.
			g.hello(sharedSock, "HELLO after the churn")
		}
		read := resolver.reads(rel)
		took := time.Since(start)
		// The loop takes an accept's token before it waits in accept: one
		// more than the burst, and one for rounding.
		allowed := burst + 1 + int(rate*took.Seconds()) + 1
		t.Logf("%s: %d users made %d connects in %v, %d taken on (at most %d)", filepath.Base(sock), len(uids), connects, took.Round(time.Millisecond), read, allowed)
		if read > allowed {
			t.Errorf("%s: the agent took on %d of the churning cgroup's %d connections in %v; at most %d may be (burst %d + %d a second)",
				filepath.Base(sock), read, connects, took.Round(time.Millisecond), allowed, burst, rate)
		}
	}
	if n := errorsCounted(t, g.reg, metrics.AcceptPacedUser); n == 0 {
		t.Error("no accept counted as paced for its user")
	}
	if n := errorsCounted(t, g.reg, metrics.AcceptPacedCgroup); n == 0 {
		t.Error("no accept counted as paced for its cgroup")
	}
	if n := errorsCounted(t, g.reg, metrics.AcceptPaced); n == 0 {
		t.Error("the container's socket never waited")
	}
}

// TestAttackRootChurnOnSharedSocket: a root process (a container without
// a user namespace) in a cgroup of its own churns on the shared socket,
// while another root process in another cgroup (the test's own) says
// HELLO there: every HELLO is answered, and the agent takes on at most
// acceptBurst + acceptRate x the time taken of the churner's connections.
// Root's peers are many containers' processes, so the churner may spend
// only its cgroup's bucket, not one of root's. Watched failing when root
// had a user's bucket: "HELLO 0 during the churn: HELLO not answered on
// shared.sock: EOF".
func TestAttackRootChurnOnSharedSocket(t *testing.T) {
	h := cgrouptest.Kernel(t)
	if os.Getuid() != 0 {
		t.Skip("the victim must be root")
	}
	rel := cgrouptest.NewContainer(t, h, 0)
	// A slow refill: once the churn has emptied a bucket, it stays empty.
	const rate, burst = 1, 20
	l := DefaultLimits
	l.AcceptRate, l.AcceptBurst = rate, burst
	l.SharedAcceptRate = 1 << 30
	r := &countingResolver{read: map[string]int{}}
	g := newChurnRig(t, h, l, r)
	sock := g.listen("shared.sock", g.s.Serve)
	start, res := g.churner(sock, 0, rel)
	begun := time.Now()
	start()
	// Once the churn has run past the burst of its cgroup (or of root),
	// the victim says HELLO.
	for deadline := time.Now().Add(time.Minute); errorsCounted(t, g.reg, metrics.AcceptPacedUser)+errorsCounted(t, g.reg, metrics.AcceptPacedCgroup) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the churn was not paced within a minute")
		}
	}
	for i := 0; i < 5; i++ {
		g.hello(sock, fmt.Sprintf("HELLO %d during the churn", i))
	}
	var connects int
	select {
	case out := <-res:
		connects = out["connects"]
	case <-time.After(2 * time.Minute):
		t.Fatal("the churner did not report within 2 minutes")
	}
	g.hello(sock, "HELLO after the churn")
	read, took := r.reads(rel), time.Since(begun)
	allowed := burst + 1 + int(rate*took.Seconds()) + 1
	t.Logf("root made %d connects in %v, %d taken on (at most %d)", connects, took.Round(time.Millisecond), read, allowed)
	if read > allowed {
		t.Errorf("the agent took on %d of the root churner's %d connections in %v; at most %d may be", read, connects, took.Round(time.Millisecond), allowed)
	}
}

// errorsCounted reads cpuslot_errors_total{reason} from reg.
func errorsCounted(t *testing.T, reg *prometheus.Registry, reason metrics.Reason) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "cpuslot_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "reason" && lp.GetValue() == string(reason) {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatal(errors.New("cpuslot_errors_total has no reason " + string(reason)))
	return 0
}

// TestPeerBuckets: each peer has its own bucket, up to maxPeerBuckets;
// beyond, new peers share one, until the full buckets are swept out (at
// most once per refill).
func TestPeerBuckets(t *testing.T) {
	b := newBuckets[int](Limits{AcceptRate: 10, AcceptBurst: 2})
	now := time.Unix(1000, 0)
	for k := 0; k < maxPeerBuckets; k++ {
		if !b.allow(k, now) || !b.allow(k, now) {
			t.Fatalf("peer %d refused within its burst", k)
		}
	}
	if b.allow(0, now) {
		t.Fatal("peer 0 allowed past its burst")
	}
	// Full: a spray of new peers shares one bucket.
	if !b.allow(-1, now) || !b.allow(-2, now) || b.allow(-3, now) {
		t.Fatal("new peers beyond the cap do not share one bucket")
	}
	if len(b.m) != maxPeerBuckets {
		t.Fatalf("%d buckets, want the cap %d", len(b.m), maxPeerBuckets)
	}
	// Once refilled (0.2 s), the full buckets go and new peers get their own.
	later := now.Add(time.Second)
	if !b.allow(-3, later) || len(b.m) != 1 {
		t.Fatalf("after a refill: %d buckets, want the new peer's alone", len(b.m))
	}
	if !b.allow(0, later) || !b.allow(0, later) || b.allow(0, later) {
		t.Fatal("a peer whose bucket was swept did not get a new one of its burst")
	}
}

// TestTurnsHoldTheirRateUnderContention: goroutines on every core take
// turns as fast as they can. A turn is granted at most burst + rate x
// elapsed times, with nothing allowed for the clock. A rate.Limiter used
// directly fails this on a loaded machine (3 runs in 10, with three more
// busy loops on two cores: 752-787 turns where 708-728 were due): a caller
// preempted between reading the time and taking the limiter's lock sets
// its clock back, and the next caller is credited that interval again.
func TestTurnsHoldTheirRateUnderContention(t *testing.T) {
	const r, burst, callers = 2000, 100, 8
	tu := newTurns(r, burst)
	var taken atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if tu.allow() {
					taken.Add(1)
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	n, allowed := taken.Load(), burst+r*elapsed.Seconds()
	t.Logf("%d turns taken by %d callers in %v, at most %.0f", n, callers, elapsed.Round(time.Millisecond), allowed)
	if float64(n) > allowed+1 {
		t.Fatalf("%d turns in %v, want at most %.0f (burst %d + %d a second)", n, elapsed, allowed, burst, r)
	}
}
