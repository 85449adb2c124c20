package client_test

// Bad input on the client side of local leasing: a table scribbled on by
// the process's own (untrusted) code, a process sharing the table that
// claims every entry and dies, two processes sharing one table, and a
// table of another layout version.

import (
	"bufio"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

func TestMain(m *testing.M) {
	if role := os.Getenv("CLIENT_TEST_CHILD"); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

// childReport is what a child process says on stdout.
type childReport struct {
	Error string   `json:"error,omitempty"`
	Slots []uint32 `json:"slots"` // slots its invocations ran in
	Local int      `json:"local"` // invocations on local leases
	N     int      `json:"n"`
}

// runChild is a second process of the container: it opens the table the
// parent passed as fd 3 and connects to the same agent.
func runChild(role string) int {
	rep := childReport{}
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		rep.Error = err.Error()
		out.Encode(rep)
		return 0
	}
	if role == "claim-raw" {
		// A sharer that claims every held entry of the table on one of its
		// threads (as its invocations would, racing the owner), reports
		// them, and waits to be killed.
		t, err := slotv1.OpenTable(os.NewFile(3, "table"))
		if err != nil {
			return fail(err)
		}
		runtime.LockOSThread()
		tid := uint32(unix.Gettid())
		for i := 0; i < t.Cap(); i++ {
			if e := t.Entry(i); e.Slot != 0 {
				if _, r := t.Claim(i, tid, e.AskedMilli, 1); r == slotv1.Claimed {
					rep.Slots = append(rep.Slots, e.Slot)
					rep.N = int(tid)
				}
			}
		}
		out.Encode(rep)
		select {}
	}
	c, err := client.Dial(os.Getenv("SOCKET"), client.Options{TableFile: os.NewFile(3, "table")})
	if err != nil {
		return fail(err)
	}
	n, _ := strconv.Atoi(os.Getenv("N"))
	switch role {
	case "claim-all":
		// One thread per entry, each holding its claim: then report and
		// wait to be killed.
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				runtime.LockOSThread()
				l, err := c.Acquire(250, "child", "")
				mu.Lock()
				if err != nil && rep.Error == "" {
					rep.Error = err.Error()
				} else if err == nil {
					rep.Slots = append(rep.Slots, l.Slot)
					if l.Local {
						rep.Local++
					}
				}
				mu.Unlock()
				wg.Done()
				select {} // hold the claim until killed
			}()
		}
		wg.Wait()
		out.Encode(rep)
		select {}
	case "invoke":
		seen := map[uint32]bool{}
		onThread(func() {
			for i := 0; i < n; i++ {
				l, err := c.Acquire(250, "child", "")
				if err != nil {
					rep.Error = err.Error()
					return
				}
				seen[l.Slot] = true
				if l.Local {
					rep.Local++
				}
				rep.N++
				l.Release(slotv1.InvocationOK)
			}
		})
		for s := range seen {
			rep.Slots = append(rep.Slots, s)
		}
		c.Close()
		out.Encode(rep)
		return 0
	}
	return fail(errors.New("unknown role " + role))
}

type childProc struct {
	cmd *exec.Cmd
	out *bufio.Reader
}

func startChild(t *testing.T, role string, f *fakeAgent, table *os.File, n int) *childProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CLIENT_TEST_CHILD="+role, "SOCKET="+f.path, "N="+strconv.Itoa(n))
	cmd.ExtraFiles = []*os.File{table}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return &childProc{cmd: cmd, out: bufio.NewReader(stdout)}
}

func (c *childProc) report(t *testing.T) childReport {
	t.Helper()
	line, err := c.out.ReadBytes('\n')
	if err != nil {
		t.Fatalf("child: %v (exit %v)", err, c.cmd.Wait())
	}
	var r childReport
	if err := json.Unmarshal(line, &r); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
	if r.Error != "" {
		t.Fatalf("child: %s", r.Error)
	}
	return r
}

// TestScribbledTable: the process's own code overwrites its slot table
// while its invocations run. They may land in another of the container's
// held slots or miss, but none crashes or hangs, invocations go on, and the
// agent hears only lease ids it granted.
func TestScribbledTable(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{TableCapacity: 8})
	tb := c.Table()
	quotas := []uint32{150, 333, 750, 1200}
	run := func(rounds int) (ok, failed int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for th := 0; th < 4; th++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				onThread(func() {
					for i := 0; i < rounds; i++ {
						l, err := c.Acquire(quotas[(th+i/7)%4], "a", "")
						mu.Lock()
						if err != nil {
							failed++
						} else {
							ok++
						}
						mu.Unlock()
						if err == nil {
							l.Release(slotv1.InvocationOK)
						}
					}
				})
			}()
		}
		wg.Wait()
		return
	}
	run(20) // fill the table
	// The scribbler stores words atomically only so that the race detector
	// stays quiet; what it stores is garbage all the same.
	mem := tb.Bytes()
	word := func(off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	entry := func(i, off int) *uint32 { return word(slotv1.TableHeaderSize + slotv1.TableEntrySize*i + off) }
	rng := rand.New(rand.NewPCG(1, 2))
	scribblers := []func(){
		func() { // random words anywhere in the entries
			for k := 0; k < 16; k++ {
				atomic.StoreUint32(word(slotv1.TableHeaderSize+4*rng.IntN((len(mem)-slotv1.TableHeaderSize)/4)), rng.Uint32())
			}
		},
		func() { // a held slot's entry made to say another quota
			atomic.StoreUint32(entry(rng.IntN(tb.Cap()), 32), quotas[rng.IntN(4)])
		},
		func() { // two entries naming one slot
			atomic.StoreUint32(entry(rng.IntN(tb.Cap()), 8), atomic.LoadUint32(entry(rng.IntN(tb.Cap()), 8)))
		},
		func() { // an entry held for ever by a thread that does not exist
			i := rng.IntN(tb.Cap())
			atomic.StoreUint32(entry(i, 0), 0x00fffffe)
		},
		func() { // the whole table zeroed, header too
			for off := 0; off < len(mem); off += 4 {
				atomic.StoreUint32(word(off), 0)
			}
		},
	}
	for round, scribble := range scribblers {
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
					scribble()
					runtime.Gosched()
				}
			}
		}()
		ok, failed := run(50)
		close(stop)
		<-done
		t.Logf("scribbler %d: %d invocations ran, %d failed", round, ok, failed)
		if ok == 0 {
			t.Errorf("scribbler %d: no invocation ran", round)
		}
	}
	// After the scribbling the client still serves every invocation.
	if ok, failed := run(20); failed != 0 || ok != 80 {
		t.Fatalf("after scribbling: %d ran, %d failed", ok, failed)
	}
	// Garbage lease ids in every entry: giving the held slots back at
	// Close must still name the leases the agent granted.
	for i := 0; i < tb.Cap(); i++ {
		atomic.StoreUint32(entry(i, 24), rng.Uint32())
	}
	c.Close()
	// Every lease the agent granted comes back, those granted while Close
	// ran too (a HOLD request on its way).
	waitFor(t, "a RELEASE per held slot", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.leases) == 0
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unknownReleases != 0 || len(f.leases) != 0 {
		t.Fatalf("the agent got %d RELEASEs of lease ids it never granted; %d leases left held", f.unknownReleases, len(f.leases))
	}
}

// TestSharedTableTwoProcesses: a child process of the container opens the
// parent's table; both run invocations at once; each claims only slots it
// holds fds for, and they never share a slot. (The fake gives a slot to
// one connection only: a slot one process released may otherwise be held
// by the other later, which is no sharing.)
func TestSharedTableTwoProcesses(t *testing.T) {
	f := newFakeAgent(t, true)
	f.mu.Lock()
	f.ownSlots = true
	f.mu.Unlock()
	c := dialFake(t, f, client.Options{TableCapacity: 8})
	ch := startChild(t, "invoke", f, c.Table().File(), 300)
	mine := map[uint32]bool{}
	local := 0
	var wg sync.WaitGroup
	for th := 0; th < 2; th++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			onThread(func() {
				for i := 0; i < 300; i++ {
					l, err := c.Acquire(250, "parent", "")
					if err != nil {
						t.Error(err)
						return
					}
					f.mu.Lock()
					mine[l.Slot] = true
					if l.Local {
						local++
					}
					f.mu.Unlock()
					l.Release(slotv1.InvocationOK)
				}
			})
		}()
	}
	wg.Wait()
	r := ch.report(t)
	if r.N != 300 || r.Local != 300 || local != 600 {
		t.Fatalf("child ran %d (%d local), parent %d local of 600", r.N, r.Local, local)
	}
	for _, s := range r.Slots {
		if mine[s] {
			t.Fatalf("slot %d used by both processes (parent %v, child %v)", s, mine, r.Slots)
		}
	}
}

// TestSharedTableClaimAllAndDie: a process sharing the table claims every
// entry and is killed holding them. The survivor's invocations still run
// (leased per thread when the table has no room), none hangs.
func TestSharedTableClaimAllAndDie(t *testing.T) {
	f := newFakeAgent(t, true)
	c := dialFake(t, f, client.Options{TableCapacity: 4})
	ch := startChild(t, "claim-all", f, c.Table().File(), 4)
	r := ch.report(t)
	if r.Local != 4 {
		t.Fatalf("child holds %d local leases, want all 4 entries", r.Local)
	}
	for i := 0; i < 4; i++ {
		if h := slotv1.Holder(c.Table().State(i)); h == 0 {
			t.Fatalf("entry %d free while the child holds every entry", i)
		}
	}
	ch.cmd.Process.Signal(syscall.SIGKILL)
	ch.cmd.Wait()
	onThread(func() {
		for i := 0; i < 20; i++ {
			l, err := c.Acquire(250, "survivor", "")
			if err != nil {
				t.Fatalf("invocation %d after the child died: %v", i, err)
			}
			if _, err := l.Release(slotv1.InvocationOK); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestSharedTableDeadClaimerFreed: a process sharing the table claims
// the survivor's held entries and dies holding them. While it lives its
// claims stand; once no thread has its TID, the survivor frees its own
// entries (compare-and-swap on the claim's generation) and serves its
// invocations from them again, with no new HOLD lease.
func TestSharedTableDeadClaimerFreed(t *testing.T) {
	f := newFakeAgent(t, true)
	f.setHoldList() // the client's loop asks HOLD_LIST each round: rounds to count
	c := dialFake(t, f, client.Options{TableCapacity: 4})
	var a, b *client.Lease
	onThread(func() {
		var err error
		if a, err = c.Acquire(250, "p", ""); err != nil {
			t.Fatal(err)
		}
		onThread(func() {
			if b, err = c.Acquire(250, "p", ""); err != nil {
				t.Fatal(err)
			}
		})
	})
	a.Release(slotv1.InvocationOK)
	b.Release(slotv1.InvocationOK)
	ch := startChild(t, "claim-raw", f, c.Table().File(), 0)
	r := ch.report(t)
	if len(r.Slots) != 2 {
		t.Fatalf("the sharer claimed slots %v, want both held entries", r.Slots)
	}
	held := func() (n int) {
		for i := 0; i < 4; i++ {
			if slotv1.Holder(c.Table().State(i)) == uint32(r.N) {
				n++
			}
		}
		return n
	}
	holdListRounds(t, f, 2)
	if n := held(); n != 2 {
		t.Fatalf("%d entries held by the live sharer after two rounds, want 2 (a live holder's claim stands)", n)
	}
	ch.cmd.Process.Signal(syscall.SIGKILL)
	ch.cmd.Wait()
	waitFor(t, "the dead sharer's claims freed", func() bool { return held() == 0 })
	holds := f.count("hold")
	onThread(func() {
		for i := 0; i < 10; i++ {
			l, err := c.Acquire(250, "survivor", "")
			if err != nil || !l.Local {
				t.Fatalf("invocation %d after the sharer died: %v", i, err)
			}
			l.Release(slotv1.InvocationOK)
		}
	})
	if h := f.count("hold"); h != holds {
		t.Fatalf("%d new HOLD leases, want none: the freed entries serve", h-holds)
	}
}

// TestTableOfOldLayout: a table from an agent or client of another layout
// version is refused with a typed error, not misread.
func TestTableOfOldLayout(t *testing.T) {
	f := newFakeAgent(t, true)
	fd, err := unix.MemfdCreate("old", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	old := os.NewFile(uintptr(fd), "old")
	defer old.Close()
	img := make([]byte, slotv1.TableSize(4))
	copy(img, slotv1.TableMagic)
	img[8] = 0 // layout 0
	img[12] = 64
	img[16] = 4
	if _, err := old.WriteAt(img, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		t.Fatal(err)
	}
	_, err = client.Dial(f.path, client.Options{TableFile: old})
	if !errors.Is(err, slotv1.ErrTableLayout) {
		t.Fatalf("Dial with a layout-0 table: %v, want ErrTableLayout", err)
	}
	var te *slotv1.TableError
	if !errors.As(err, &te) || te.Field != "layout" || te.Got != 0 || te.Want != slotv1.TableLayout {
		t.Fatalf("error %v does not say which layout", err)
	}
}
