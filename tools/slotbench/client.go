package main

// The client side: a runtime stand-in in one container.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
	"github.com/cpuslot/cpuslot/internal/cgroup"
)

type job struct {
	Threads    int      `json:"threads"`
	N          int      `json:"n"`
	Sporadic   bool     `json:"sporadic"`
	Burst      int      `json:"burst"`
	PauseMinNS int64    `json:"pauseMin"`
	PauseMaxNS int64    `json:"pauseMax"`
	Quotas     []uint32 `json:"quotas"`
	Switch     float64  `json:"switch"`
	Quota      uint32   `json:"quota"` // -share only
	Share      int64    `json:"shareNS,omitempty"`
	Echo       string   `json:"echo,omitempty"`
	// Floor: the placement files of two slots the threads write "0" to,
	// alternating, instead of acquiring.
	Floor [2][]string `json:"floor,omitempty"`
	// Probe asks whether the client leases locally.
	Probe bool `json:"probe,omitempty"`
	// Lend is a -lend cell (lend.go).
	Lend *lendJob `json:"lend,omitempty"`
}

type jobResult struct {
	LatNS    []int64     `json:"lat"`
	AcqNS    []int64     `json:"acq"`
	FirstErr string      `json:"firstErr,omitempty"`
	NoWrite  int         `json:"noWrite"`
	Total    int         `json:"total"`
	Errors   int         `json:"errors"`
	SharePct float64     `json:"sharePct"`
	Local    bool        `json:"local,omitempty"`
	Lend     *lendResult `json:"lend,omitempty"`
	Err      string      `json:"err,omitempty"`
}

// failed counts an invocation that failed, keeping the first error.
func (r *jobResult) failed(err error) {
	if r.Errors == 0 {
		r.FirstErr = err.Error()
	}
	r.Errors++
}

type benchClient struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startClient(h *cgroup.Hierarchy, rel, socket string, v variant) (*benchClient, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "SLOTBENCH_CLIENT=1", "SLOTBENCH_SOCKET="+socket, "SLOTBENCH_LINGER="+v.linger.String(),
		"SLOTBENCH_LOCAL="+strconv.FormatBool(v.local))
	cmd.Stderr = os.Stderr
	// A client runs in a PID namespace of its own, as in a pod, alone in
	// its cgroup: on v1 the agent passes placement fds only to a peer
	// whose PID namespace holds its whole container (docs/security.md).
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := h.StartIn(cmd, rel); err != nil {
		return nil, err
	}
	c := &benchClient{cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20)}
	// The first job line also tells the child it has been placed.
	return c, nil
}

func (c *benchClient) run(j job) (*jobResult, error) {
	b, _ := json.Marshal(j)
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	line, err := c.out.ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	var r jobResult
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, err
	}
	if r.Err != "" {
		return nil, fmt.Errorf("%s", r.Err)
	}
	return &r, nil
}

func (c *benchClient) close() {
	c.in.Close()
	c.cmd.Wait()
}

func clientMain() {
	in := bufio.NewScanner(os.Stdin)
	var c *client.Client
	enc := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var j job
		var r jobResult
		if err := json.Unmarshal(in.Bytes(), &j); err != nil {
			r.Err = err.Error()
		} else {
			if c == nil && j.Echo == "" && j.Floor[0] == nil {
				var err error
				linger, _ := time.ParseDuration(os.Getenv("SLOTBENCH_LINGER"))
				local := os.Getenv("SLOTBENCH_LOCAL") == "true"
				if c, err = client.Dial(os.Getenv("SLOTBENCH_SOCKET"), client.Options{Name: "slotbench", Wait: time.Second, Linger: linger, NoLocal: !local}); err != nil {
					r.Err = err.Error()
					enc.Encode(r)
					continue
				}
			}
			if j.Probe {
				r.Local = c.Hello().Flags&slotv1.HelloOKLocal != 0
			} else if j.Lend != nil {
				lr := lendJobRun(c, *j.Lend)
				r.Lend = &lr
			} else if j.Floor[0] != nil {
				r = floorJob(j)
			} else if j.Share > 0 {
				r.SharePct, r.Err = share(c, j)
			} else if j.Echo != "" {
				r = echoJob(j)
			} else {
				r = runJob(c, j)
			}
		}
		enc.Encode(r)
	}
}

// workers keeps one locked OS thread per worker across jobs, as a runtime's
// worker pool would.
var workers []chan func()

func worker(i int) chan func() {
	for len(workers) <= i {
		ch := make(chan func())
		go func() {
			runtime.LockOSThread()
			for f := range ch {
				f()
			}
		}()
		workers = append(workers, ch)
	}
	return workers[i]
}

// arrivals drives thread t's invocations: pauses after each burst when
// sporadic, and its action and quota (a tenth switch to another).
type arrivals struct {
	j   job
	t   int
	rng *rand.Rand
}

func newArrivals(j job, t int) *arrivals {
	return &arrivals{j: j, t: t, rng: rand.New(rand.NewPCG(uint64(t), uint64(time.Now().UnixNano())))}
}

// next waits before invocation i if it starts a burst, and returns the
// index of its quota (and action).
func (a *arrivals) next(i int) int {
	j := a.j
	if j.Sporadic && i%j.Burst == 0 {
		time.Sleep(time.Duration(j.PauseMinNS + a.rng.Int64N(j.PauseMaxNS-j.PauseMinNS+1)))
	}
	home := a.t % len(j.Quotas)
	if len(j.Quotas) > 1 && a.rng.Float64() < j.Switch {
		return (home + 1 + a.rng.IntN(len(j.Quotas)-1)) % len(j.Quotas)
	}
	return home
}

// collect runs body on j.Threads worker threads and merges their results.
func collect(j job, body func(t int, r *jobResult)) jobResult {
	var mu sync.Mutex
	var r jobResult
	var wg sync.WaitGroup
	for t := 0; t < j.Threads; t++ {
		wg.Add(1)
		worker(t) <- func() {
			defer wg.Done()
			var mine jobResult
			body(t, &mine)
			mu.Lock()
			r.LatNS = append(r.LatNS, mine.LatNS...)
			r.AcqNS = append(r.AcqNS, mine.AcqNS...)
			if r.FirstErr == "" {
				r.FirstErr = mine.FirstErr
			}
			r.NoWrite += mine.NoWrite
			r.Total += mine.Total
			r.Errors += mine.Errors
			mu.Unlock()
		}
	}
	wg.Wait()
	return r
}

func runJob(c *client.Client, j job) jobResult {
	actions := make([]string, len(j.Quotas))
	for i, q := range j.Quotas {
		actions[i] = fmt.Sprintf("bench/fn%d", q)
	}
	return collect(j, func(t int, r *jobResult) {
		a := newArrivals(j, t)
		r.LatNS = make([]int64, 0, j.N)
		r.AcqNS = make([]int64, 0, j.N)
		for i := 0; i < j.N; i++ {
			q := a.next(i)
			start := time.Now()
			l, err := c.Acquire(j.Quotas[q], actions[q], "")
			acq := time.Since(start)
			if err == nil {
				_, err = l.Release(slotv1.InvocationOK)
			}
			d := time.Since(start)
			if err != nil {
				r.failed(err)
				continue
			}
			r.LatNS = append(r.LatNS, d.Nanoseconds())
			r.AcqNS = append(r.AcqNS, acq.Nanoseconds())
			if l.Place == slotv1.PlaceNone && (l.Outcome == slotv1.OutcomeAffinityHit || l.Outcome == slotv1.OutcomeCacheHit) || l.Reused {
				r.NoWrite++
			}
			r.Total++
		}
	})
}

// floorJob is the floor under any slot protocol: each invocation is one
// write of "0" to every placement fd of a slot that is already open,
// alternating between two slots, so that every write moves the thread.
func floorJob(j job) jobResult {
	var fds [2][]int
	for s, paths := range j.Floor {
		for _, p := range paths {
			fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return jobResult{Err: err.Error()}
			}
			defer unix.Close(fd)
			fds[s] = append(fds[s], fd)
		}
	}
	zero := []byte("0")
	return collect(j, func(t int, r *jobResult) {
		a := newArrivals(j, t)
		r.LatNS = make([]int64, 0, j.N)
		for i := 0; i < j.N; i++ {
			a.next(i)
			start := time.Now()
			var err error
			for _, fd := range fds[i%2] {
				if _, err = unix.Write(fd, zero); err != nil {
					break
				}
			}
			d := time.Since(start)
			if err != nil {
				r.failed(err)
				continue
			}
			r.LatNS = append(r.LatNS, d.Nanoseconds())
			r.AcqNS = append(r.AcqNS, d.Nanoseconds())
			r.Total++
		}
	})
}

// floorSlots finds the two slots the agent pre-warmed in the floor's
// container and returns their placement files (one per hierarchy).
func floorSlots(h *cgroup.Hierarchy, rel string) ([2][]string, error) {
	var out [2][]string
	dirs, err := filepath.Glob(filepath.Join(h.CPURoot, rel, cgroup.SlotPrefix+"*"))
	if err != nil || len(dirs) < 2 {
		return out, fmt.Errorf("floor: want 2 pre-warmed slots in %s, found %d (%v)", rel, len(dirs), err)
	}
	sort.Strings(dirs)
	file := h.ThreadsFile()
	for s := 0; s < 2; s++ {
		name := filepath.Base(dirs[s])
		out[s] = append(out[s], filepath.Join(dirs[s], file))
		if h.AcctRoot != "" {
			out[s] = append(out[s], filepath.Join(h.AcctRoot, rel, name, file))
		}
	}
	return out, nil
}

// echoJob measures bare round trips from a locked thread with blocking
// syscalls, as the slot client makes them.
func echoJob(j job) jobResult {
	var r jobResult
	done := make(chan struct{})
	worker(0) <- func() {
		defer close(done)
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			r.Err = err.Error()
			return
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: j.Echo}); err != nil {
			r.Err = err.Error()
			return
		}
		buf := make([]byte, 64)
		for i := 0; i < j.N; i++ {
			start := time.Now()
			if _, err := unix.Write(fd, buf[:40]); err != nil {
				r.Err = err.Error()
				return
			}
			for got := 0; got < 40; {
				n, err := unix.Read(fd, buf[got:])
				if err == unix.EINTR {
					continue
				}
				if err != nil || n == 0 {
					r.Err = fmt.Sprint("echo read: ", err)
					return
				}
				got += n
			}
			r.LatNS = append(r.LatNS, time.Since(start).Nanoseconds())
		}
	}
	<-done
	return r
}

func share(c *client.Client, j job) (float64, string) {
	done := make(chan struct{})
	var pct float64
	var errStr string
	worker(0) <- func() {
		defer close(done)
		l, err := c.Acquire(j.Quota, "burn", "")
		if err != nil {
			errStr = err.Error()
			return
		}
		start := time.Now()
		for time.Since(start) < time.Duration(j.Share) {
		}
		wall := time.Since(start)
		u, err := l.Release(slotv1.InvocationOK)
		if err != nil {
			errStr = err.Error()
			return
		}
		pct = 100 * u.CPU.Seconds() / wall.Seconds()
	}
	<-done
	return pct, errStr
}
