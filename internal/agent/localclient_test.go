package agent_test

// The Go client's local leasing against the real agent and kernel: threads
// in the right slots, usage reaching the agent's metrics, an agent restart
// under load with every invocation kept in a slot, and a client scribbling
// over its own table while another container is served as before.

import (
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
)

// inSlot says whether the calling thread sits in slot id of container rel.
func inSlot(h *cgroup.Hierarchy, rel string, id uint32) bool {
	p, err := h.PathOfThread(os.Getpid(), syscall.Gettid())
	return err == nil && p == rel+"/"+cgroup.SlotName(id)
}

// onLockedThread runs f on an OS thread of its own that ends with it: a
// thread left in a slot must not run the agent's goroutines (the agent runs
// in this process).
func onLockedThread(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked
		f()
	}()
	<-done
}

// TestLocalClient: with local leasing (the client's default) a thread's
// repeated invocations cost the agent one HOLD lease, sit in the granted
// slot, and their usage reaches the agent's per-action series.
func TestLocalClient(t *testing.T) {
	e := agenttest.NewEnv(t, 0, nil)
	a := e.Start()
	cgrouptest.JoinProcess(t, e.H, e.Rel)
	c, err := client.Dial(e.Socket, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Hello().Flags&slotv1.HelloOKLocal == 0 {
		t.Fatalf("the agent did not grant LOCAL: %+v", c.Hello())
	}
	const n = 100
	noWrite := 0
	onLockedThread(func() {
		for i := 0; i < n; i++ {
			q := uint32(250)
			if i/10%2 == 1 {
				q = 500
			}
			l, err := c.Acquire(q, "guest/local", strconv.Itoa(i))
			if err != nil {
				t.Error(err)
				return
			}
			if !l.Local || l.QuotaMilli != q {
				t.Errorf("invocation %d: local %v quota %d", i, l.Local, l.QuotaMilli)
				return
			}
			if !inSlot(e.H, e.Rel, l.Slot) {
				t.Errorf("invocation %d: thread not in slot %d", i, l.Slot)
				return
			}
			if l.Place == slotv1.PlaceNone {
				noWrite++
			}
			if _, err := l.Release(slotv1.InvocationOK); err != nil {
				t.Error(err)
				return
			}
		}
	})
	if t.Failed() {
		return
	}
	// One write per switch of quota (10), at most.
	if noWrite < n-10 {
		t.Fatalf("%d of %d invocations made no write, want at least %d", noWrite, n, n-10)
	}
	if s := a.Summaries()[0]; s.Leases != 2 {
		t.Fatalf("the agent holds %d leases for the process, want its 2 HOLD leases", s.Leases)
	}
	c.Close()
	agenttest.WaitFor(t, "USAGE of 100 invocations and both holds released", func() bool {
		return strings.Contains(agenttest.Scrape(t, a), `cpuslot_lease_releases_total{action="guest/local",container="`+e.Rel+`",cpuslot_container="`+e.Rel+`",namespace="",outcome="ok",pod=""} 100`) &&
			a.Summaries()[0].Leases == 0
	})
}

// TestLocalClientRestart: kill -9 the agent under a stream of invocations
// of a client that leases locally. Every invocation of a quota the process
// held runs in a slot of its container throughout, while no agent listens
// too; none fails open. (Without local leasing TestRestart's invocations
// fail while the agent is away.)
func TestLocalClientRestart(t *testing.T) {
	e := agenttest.NewEnv(t, 0, nil)
	agentEnv := []string{"SOCKET=" + e.Socket, "CONTAINER=" + e.Rel, "HOST_NAMESPACE_FDS=1"}
	startAgent := func() *agenttest.Child { return agenttest.StartAgentChild(t, e.H, agentEnv) }
	first := startAgent()
	cgrouptest.JoinProcess(t, e.H, e.Rel)
	c, err := client.Dial(e.Socket, client.Options{ReconnectFor: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Hello().Flags&slotv1.HelloOKLocal == 0 {
		t.Fatalf("the agent did not grant LOCAL: %+v", c.Hello())
	}
	const workers = 2
	var ok, failed, outside, away atomic.Int64
	var down atomic.Bool
	var okAfter [workers]atomic.Int64
	var restarted atomic.Bool
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread sits in a slot
			q := 250 * uint32(1+w)
			for {
				select {
				case <-stop:
					return
				default:
				}
				after, wasDown := restarted.Load(), down.Load()
				l, err := c.Acquire(q, "stream", "")
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					time.Sleep(time.Millisecond)
					continue
				}
				if !inSlot(e.H, e.Rel, l.Slot) {
					outside.Add(1)
				}
				time.Sleep(200 * time.Microsecond) // the invocation
				if _, err := l.Release(slotv1.InvocationOK); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				ok.Add(1)
				if wasDown {
					away.Add(1)
				}
				if after {
					okAfter[w].Add(1)
				}
			}
		}(w)
	}
	agenttest.WaitFor(t, "100 invocations before the kill", func() bool { return ok.Load() >= 100 })
	first.Cmd.Process.Signal(syscall.SIGKILL)
	first.Cmd.Wait()
	os.Remove(e.Socket)
	down.Store(true)
	// Counted, not timed: invocations go on with no agent at all.
	agenttest.WaitFor(t, "100 invocations while no agent runs", func() bool { return away.Load() >= 100 })
	second := startAgent()
	down.Store(false)
	restarted.Store(true)
	agenttest.WaitFor(t, "20 invocations of every worker after the restart", func() bool {
		for w := range okAfter {
			if okAfter[w].Load() < 20 {
				return false
			}
		}
		return true
	})
	close(stop)
	wg.Wait()
	t.Logf("%d invocations, %d while no agent ran; %d failed, %d outside a slot", ok.Load(), away.Load(), failed.Load(), outside.Load())
	if failed.Load() != 0 || outside.Load() != 0 {
		t.Fatalf("%d invocations failed (first: %v), %d ran outside a slot", failed.Load(), firstErr.Load(), outside.Load())
	}
	c.Close()
	second.Cmd.Process.Signal(syscall.SIGTERM)
	second.Cmd.Wait()
	if _, err := e.H.RemoveAllSlots(e.Rel); err != nil {
		t.Fatal(err)
	}
}

// TestLocalClientScribbleOwnTable: a runtime whose own code overwrites its
// slot table hurts only its own invocations: the agent keeps serving, and a
// process in another container runs every invocation in its own slots.
func TestLocalClientScribbleOwnTable(t *testing.T) {
	e := agenttest.NewEnv(t, 0, nil)
	other := cgrouptest.NewContainer(t, e.H, 0)
	e.Cfg.Standalone.Containers = append(e.Cfg.Standalone.Containers, other)
	t.Cleanup(func() {
		if left := cgrouptest.Leftovers(e.H, other); len(left) != 0 {
			t.Errorf("slot directories leaked: %v", left)
		}
	})
	a := e.Start()
	cgrouptest.JoinProcess(t, e.H, e.Rel)
	c, err := client.Dial(e.Socket, client.Options{TableCapacity: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tb := c.Table()
	if tb == nil {
		t.Fatal("no slot table: the agent did not grant LOCAL")
	}
	mem := tb.Bytes()
	rng := rand.New(rand.NewPCG(3, 4))
	stop := make(chan struct{})
	var scribbles atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			off := slotv1.TableHeaderSize + 4*rng.IntN((len(mem)-slotv1.TableHeaderSize)/4)
			atomic.StoreUint32((*uint32)(unsafe.Pointer(&mem[off])), rng.Uint32N(16))
			scribbles.Add(1)
			runtime.Gosched()
		}
	}()
	var ran, failed atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Never unlocked: a thread left in a slot must not run the
			// agent's goroutines (the agent runs in this process).
			runtime.LockOSThread()
			for i := 0; i < 200; i++ {
				l, err := c.Acquire([]uint32{250, 500}[(w+i/5)%2], "scribbled", "")
				if err != nil {
					failed.Add(1)
					continue
				}
				ran.Add(1)
				l.Release(slotv1.InvocationOK)
			}
		}()
	}
	// Meanwhile a runtime in the other container.
	// In a PID namespace of its own, as in a pod: it places itself.
	ch := agenttest.Spawn(t, e.H, "acquire", agenttest.ChildOpts{Cgroup: other, NewPIDNS: true, Env: []string{"SOCKET=" + e.Socket, "QUOTA=250", "N=200"}})
	var r agenttest.AcquireResult
	ch.Result(t, &r)
	wg.Wait()
	close(stop)
	t.Logf("scribbling container: %d invocations ran, %d failed, %d words scribbled", ran.Load(), failed.Load(), scribbles.Load())
	if r.Error != "" || r.InSlot != 200 {
		t.Fatalf("the other container: %+v", r)
	}
	if ran.Load() == 0 {
		t.Fatal("the scribbling container ran nothing")
	}
	if !a.Ready() {
		t.Fatal("the agent is not ready")
	}
}
