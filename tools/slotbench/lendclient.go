package main

// The client side of -lend: the cells' closed loops of invocations, each
// burning its CPU on a leased slot.

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

// threadCPU is the calling thread's CPU time. It is read with a raw
// system call, which the Go scheduler does not see: burn reads it after
// every few hundred multiplications, and a thread that its slot's quota
// stops inside a call the scheduler sees stays "in a system call" for the
// runtime's monitor (sysmon), which takes its P away and, having taken
// one, polls every 20 us for the next millisecond. With unix.ClockGettime
// sysmon used 13-16% of the container's limit outside the slots
// (docs/lending.md).
func threadCPU() time.Duration {
	var ts unix.Timespec
	unix.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_THREAD_CPUTIME_ID, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

// procsForWorkers raises GOMAXPROCS to n workers and one P for the other
// goroutines (the client's connections, timers). Each worker is a locked
// OS thread standing in for a runtime's native thread: one that its slot's
// quota throttles keeps its P (for Go it is running), so with fewer Ps
// than burning workers the others wait for a P while their slots have
// quota left, which a runtime's native threads do not. Never lowered.
func procsForWorkers(n int) {
	if runtime.GOMAXPROCS(0) < n+1 {
		runtime.GOMAXPROCS(n + 1)
	}
}

// burn spins until the calling thread has used d of CPU.
func burn(d time.Duration) {
	end := threadCPU() + d
	x := 1.0
	for threadCPU() < end {
		for i := 0; i < 200; i++ {
			x = x*1.0000001 + 1e-9
		}
	}
	sink = x
}

var sink float64

func lendJobRun(c *client.Client, j lendJob) lendResult {
	var mu sync.Mutex
	var out lendResult
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(time.Duration(j.DurationNS))
	// Thread t < IOThreads waits; with chains, threads come in groups of
	// Chain, the first of each group the chain's head.
	chains := 0
	if j.Chain > 0 {
		if chains = j.IOThreads / j.Chain; chains == 0 {
			return lendResult{Errors: 1, FirstErr: fmt.Sprintf("chains of %d need more than the %d waiting threads", j.Chain, j.IOThreads)}
		}
	}
	procsForWorkers(j.Threads)
	worker(j.Threads - 1) // all workers exist before a chain hands a call to one
	for t := 0; t < j.Threads; t++ {
		waiting := t < j.IOThreads
		if chains > 0 && waiting && (t%j.Chain != 0 || t/j.Chain >= chains) {
			continue // a callee's thread: its head drives it
		}
		wg.Add(1)
		worker(t) <- func() {
			defer wg.Done()
			var r lendResult
			var begin time.Time // the invocation's first ACQUIRE: a queue timeout's retry is the same invocation
			for time.Now().Before(deadline) {
				if begin.IsZero() {
					begin = time.Now()
				}
				var err error
				switch {
				case chains > 0 && waiting:
					err = chainCall(c, j, t, 0, &r)
				case waiting:
					err = waitingInvocation(c, j, &r)
				default:
					err = cpuInvocation(c, j, &r)
				}
				if err != nil {
					r.fail(err)
					continue
				}
				d := time.Since(begin).Nanoseconds()
				begin = time.Time{}
				if waiting {
					r.IOLatNS = append(r.IOLatNS, d)
				} else {
					r.CPULatNS = append(r.CPULatNS, d)
				}
			}
			mu.Lock()
			out.merge(r)
			mu.Unlock()
		}
	}
	wg.Wait()
	out.ElapsedNS = time.Since(start).Nanoseconds()
	return out
}

// cpuInvocation burns the invocation's CPU at once.
func cpuInvocation(c *client.Client, j lendJob, r *lendResult) error {
	l, err := c.Acquire(j.Quota, "bench/lend", "")
	if err != nil {
		return err
	}
	burn(time.Duration(j.CPUWorkNS))
	return r.release(l, nil)
}

// waitingInvocation burns the invocation's CPU in segments, each followed
// by a wait, asleep with lending.
func waitingInvocation(c *client.Client, j lendJob, r *lendResult) error {
	l, err := c.Acquire(j.Quota, "bench/lend", "")
	if err != nil {
		return err
	}
	seg := time.Duration(j.CPUWorkNS) / time.Duration(j.Segments)
	// What the segment takes at the quota: the slot is idle WaitPct of
	// the quota's time, as the paper measures.
	atQuota := float64(seg) * 1000 / float64(j.Quota)
	wait := time.Duration(atQuota * float64(j.WaitPct) / float64(100-j.WaitPct))
	for s := 0; s < j.Segments && err == nil; s++ {
		burn(seg)
		err = r.await(c, l, func() error { time.Sleep(wait); return nil })
	}
	return r.release(l, err)
}

// chainCall runs function depth of a chain on thread t+depth: half its CPU,
// a synchronous call of the next function (asleep while it runs, as the
// runtime's chain calls are), the other half; the last function only
// burns. Every function asks for the same quota and the chain's CPU is one
// invocation's, split evenly.
func chainCall(c *client.Client, j lendJob, t, depth int, r *lendResult) error {
	l, err := c.Acquire(j.Quota, "bench/chain", "")
	if err != nil {
		return err
	}
	seg := time.Duration(j.CPUWorkNS) / time.Duration(j.Chain)
	if depth == j.Chain-1 {
		burn(seg)
		return r.release(l, nil)
	}
	burn(seg / 2)
	err = r.await(c, l, func() error {
		done := make(chan error, 1)
		worker(t + depth + 1) <- func() { done <- chainCall(c, j, t, depth+1, r) }
		return <-done
	})
	if err == nil {
		burn(seg - seg/2)
	}
	return r.release(l, err)
}

// await runs wait with lease l asleep: SLEEP before, WAKE after (each
// sends nothing without lending).
func (r *lendResult) await(c *client.Client, l *client.Lease, wait func() error) error {
	if err := l.Sleep(); err != nil {
		var pe *slotv1.Error
		if !errors.As(err, &pe) || pe.Code != slotv1.CodeRejected {
			return err
		}
		r.SleepsRefused++ // over the agent's SLEEP rate: the lease stays awake
	}
	werr := wait()
	t1 := time.Now()
	if err := l.Wake(); err != nil {
		return err
	}
	if c.Hello().Flags&slotv1.HelloOKLend != 0 {
		r.WakeNS = append(r.WakeNS, time.Since(t1).Nanoseconds())
	}
	return werr
}

// release ends lease l after an invocation that ended with err, counting
// it and its slot's CPU.
func (r *lendResult) release(l *client.Lease, err error) error {
	how := slotv1.InvocationOK
	if err != nil {
		how = slotv1.InvocationFailed
	}
	u, rerr := l.Release(how)
	if err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	r.UsedNS += float64(u.CPU.Nanoseconds())
	r.Completed++
	return nil
}

func (r *lendResult) fail(err error) {
	if r.Errors == 0 {
		r.FirstErr = err.Error()
	}
	r.Errors++
	time.Sleep(time.Millisecond) // no busy loop against a refusing agent
}

func (r *lendResult) merge(o lendResult) {
	r.Completed += o.Completed
	r.CPULatNS = append(r.CPULatNS, o.CPULatNS...)
	r.IOLatNS = append(r.IOLatNS, o.IOLatNS...)
	r.WakeNS = append(r.WakeNS, o.WakeNS...)
	r.UsedNS += o.UsedNS
	r.SleepsRefused += o.SleepsRefused
	if r.Errors == 0 {
		r.FirstErr = o.FirstErr
	}
	r.Errors += o.Errors
}

// parseFloats parses a comma-separated list of numbers.
func parseFloats(flagName, s string) []float64 {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 || v > 1 {
			fatal(fmt.Errorf("-%s: %q is not a number in [0, 1]", flagName, f))
		}
		out = append(out, v)
	}
	return out
}
