// Command slotbench measures what a CPU slot costs per invocation, side by
// side for the four pool modes, in one run on this machine's kernel.
//
// One in-process agent serves four containers, one per mode. In each
// container a client process (this binary, re-executed) plays a runtime:
// its locked OS threads acquire a slot, are placed, and release it, through
// the real socket. Rounds alternate between modes so that machine noise
// hits all of them alike. Steady arrivals run back to back; sporadic ones
// pause 20-30 ms every few invocations, which is when the kernel's cgroup
// lock makes numeric-TID moves slow.
//
//	slotbench                    # on this machine's hierarchy
//	slotbench -vm                # in the cgroup v2 VM, without and with favordynmods
//	slotbench -scale             # one agent, 250 containers x 64 slots (scale.go)
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/pool"
	"github.com/cpuslot/cpuslot/test/vm"
)

var modes = []pool.Mode{pool.Uncached, pool.CacheEager, pool.CacheLazy, pool.Affinity}

// variant is one row of the comparison: a pool mode, and whether the client
// keeps leases between invocations (client.Options.Linger).
type variant struct {
	name   string
	mode   pool.Mode
	linger time.Duration
}

var variants []variant

type params struct {
	steadyN, sporadicN int
	threads            []int
	rounds             int
	burst              int
	share              time.Duration
}

func main() {
	steadyN := flag.Int("steady", 2000, "invocations per thread per cell, steady arrivals")
	sporadicN := flag.Int("sporadic", 200, "invocations per thread per cell, sporadic arrivals")
	threads := flag.String("threads", "1,2,4", "client thread counts")
	rounds := flag.Int("rounds", 4, "rounds per cell (modes alternate between rounds)")
	burst := flag.Int("burst", 4, "sporadic: invocations between pauses")
	share := flag.Duration("share", 10*time.Second, "also measure a CPU-bound thread in a 250m slot for this long (0: skip)")
	modeList := flag.String("modes", "uncached,cache-eager,cache-lazy,affinity", "modes to compare (ratios need uncached)")
	linger := flag.Duration("linger", 100*time.Millisecond, "also run affinity with a client that keeps leases this long (0: skip)")
	cpuprofile := flag.String("cpuprofile", "", "write the agent side's CPU profile here")
	inVM := flag.Bool("vm", false, "run inside the cgroup v2 VM, once without and once with favordynmods")
	scale := flag.Bool("scale", false, "measure one agent serving many containers instead (see -containers)")
	var sp scaleParams
	flag.IntVar(&sp.containers, "containers", 250, "-scale: containers served")
	flag.IntVar(&sp.slots, "slots", 64, "-scale: slots pre-warmed per container")
	flag.DurationVar(&sp.idle, "idle", 20*time.Second, "-scale: how long to measure the idle agent's CPU")
	flag.IntVar(&sp.hellos, "hellos", 500, "-scale: connect + HELLO samples per phase")
	flag.IntVar(&sp.acquires, "acquires", 5000, "-scale: ACQUIRE samples per phase")
	flag.IntVar(&sp.flood, "flood", 5000, "-scale: stalled connections the flooding container opens")
	flag.IntVar(&sp.floodProcs, "flood-procs", 100, "-scale: processes of the flooding container the connections are spread over")
	flag.Parse()
	if os.Getenv("SLOTBENCH_CLIENT") != "" {
		clientMain()
		return
	}
	if role := os.Getenv("SLOTBENCH_SCALE"); role != "" {
		scaleChild(role)
		return
	}
	if *scale {
		fatal(scaleBench(sp))
		return
	}
	p := params{steadyN: *steadyN, sporadicN: *sporadicN, rounds: *rounds, burst: *burst, share: *share}
	for _, s := range strings.Split(*threads, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fatal(fmt.Errorf("-threads %q", *threads))
		}
		p.threads = append(p.threads, n)
	}
	modes = nil
	for _, s := range strings.Split(*modeList, ",") {
		m, err := pool.ParseMode(strings.TrimSpace(s))
		fatal(err)
		modes = append(modes, m)
		variants = append(variants, variant{name: m.String(), mode: m})
		if m == pool.Affinity && *linger > 0 {
			variants = append(variants, variant{name: "affinity+linger", mode: m, linger: *linger})
		}
	}
	if *inVM {
		fatal(runInVM(os.Args[1:]))
		return
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		fatal(err)
		fatal(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	if err := bench(p); err != nil {
		pprof.StopCPUProfile()
		fatal(err)
	}
}

func fatal(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "slotbench:", err)
		os.Exit(1)
	}
}

// runInVM boots the test VM with this (static) binary and runs the same
// benchmark inside, without and with favordynmods.
func runInVM(args []string) error {
	if err := vm.Available(); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var inner []string
	for _, a := range args {
		if a != "-vm" && a != "--vm" {
			inner = append(inner, a)
		}
	}
	for _, mount := range []string{"", "favordynmods"} {
		fmt.Printf("\n### cgroup v2 VM (kernel 6.1, software emulation), mount options: %q\n", mount)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		r, err := vm.Run(ctx, vm.Options{
			Command:      append([]string{"/bin/slotbench"}, inner...),
			Files:        map[string]string{"/bin/slotbench": exe},
			MountOptions: mount,
			Output:       os.Stdout,
		})
		cancel()
		if err != nil {
			return err
		}
		if r.ExitCode != 0 {
			return fmt.Errorf("benchmark in the VM exited %d", r.ExitCode)
		}
	}
	return nil
}

type cell struct {
	scenario string
	threads  int
	name     string
	lat      []time.Duration
	acq      []time.Duration
	firstErr string
	noWrite  int
	total    int
	errors   int
}

func bench(p params) error {
	tb, err := newTestbed("bench")
	if err != nil {
		return err
	}
	defer tb.close()
	h := tb.h
	cfg := tb.config()
	cfg.LogLevel = "warn"
	maxThreads := 0
	for _, n := range p.threads {
		maxThreads = max(maxThreads, n)
	}
	var containers []discover.Container
	for _, m := range modes {
		rel, err := tb.container(m.String())
		if err != nil {
			return err
		}
		pc, err := cfg.Settings()
		if err != nil {
			return err
		}
		pc.Mode = m.String()
		pc.Prewarm = map[uint32]int{250: maxThreads}
		pc.MaxSlots = 4 * maxThreads
		if m == pool.Uncached {
			pc.Prewarm = nil
		}
		containers = append(containers, discover.Container{Name: m.String(), CgroupPath: rel, Pool: &pc})
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, err := agent.New(cfg, log)
	if err != nil {
		return err
	}
	if err := tb.run(a, sourceList(containers)); err != nil {
		return err
	}

	echo := filepath.Join(tb.dir, "echo.sock")
	if err := serveEcho(echo); err != nil {
		return err
	}

	clients := map[string]*benchClient{}
	for _, v := range variants {
		c, err := startClient(h, tb.root+"/"+v.mode.String(), cfg.Socket, v.linger)
		if err != nil {
			return fmt.Errorf("client for %s: %w", v.name, err)
		}
		defer c.close()
		clients[v.name] = c
	}

	fdm := "n/a (v1)"
	if h.Version == 2 {
		fdm = strconv.FormatBool(h.FavorDynMods)
	}
	fmt.Printf("slotbench: %s, kernel %s, favordynmods %s, %d CPUs\n", h, kernelRelease(), fdm, runtime.NumCPU())
	fmt.Printf("per invocation: acquire + placement + release through the agent socket; %d rounds per cell, modes alternating\n\n", p.rounds)

	floor, err := clients[variants[0].name].run(job{Echo: echo, N: p.steadyN})
	if err != nil {
		return fmt.Errorf("echo: %w", err)
	}
	sortNS(floor.LatNS)
	fmt.Printf("IPC floor, a bare 64-byte round trip to a Go server on the same machine: p50 %s  p90 %s  p99 %s\n\n",
		us(time.Duration(pctNS(floor.LatNS, .5))), us(time.Duration(pctNS(floor.LatNS, .9))), us(time.Duration(pctNS(floor.LatNS, .99))))

	var cells []*cell
	for _, scenario := range []string{"steady", "sporadic"} {
		n := p.steadyN
		if scenario == "sporadic" {
			n = p.sporadicN
		}
		for _, threads := range p.threads {
			byMode := map[string]*cell{}
			for _, v := range variants {
				byMode[v.name] = &cell{scenario: scenario, threads: threads, name: v.name}
				cells = append(cells, byMode[v.name])
			}
			per := max(1, n/p.rounds)
			for r := 0; r < p.rounds; r++ {
				order := append([]variant(nil), variants...)
				rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
				for _, v := range order {
					res, err := clients[v.name].run(job{Threads: threads, N: per, Sporadic: scenario == "sporadic", Burst: p.burst, Quota: 250})
					if err != nil {
						return fmt.Errorf("%s %s: %w", scenario, v.name, err)
					}
					c := byMode[v.name]
					for _, ns := range res.LatNS {
						c.lat = append(c.lat, time.Duration(ns))
					}
					for _, ns := range res.AcqNS {
						c.acq = append(c.acq, time.Duration(ns))
					}
					if c.firstErr == "" {
						c.firstErr = res.FirstErr
					}
					c.noWrite += res.NoWrite
					c.total += res.Total
					c.errors += res.Errors
				}
			}
			printCells(byMode)
		}
	}
	if p.share > 0 && clients["affinity"] != nil {
		res, err := clients["affinity"].run(job{Share: p.share.Nanoseconds(), Quota: 250})
		if err != nil {
			return err
		}
		fmt.Printf("\nCPU-bound thread in a 250m slot (affinity) for %v: %.1f%% of a core (target 25%% +/- 2.5)\n", p.share, res.SharePct)
	}
	return nil
}

func sortNS(v []int64) { sort.Slice(v, func(i, j int) bool { return v[i] < v[j] }) }

func pctNS(v []int64, q float64) int64 {
	if len(v) == 0 {
		return 0
	}
	return v[min(len(v)-1, int(q*float64(len(v))))]
}

// serveEcho answers every read with the same bytes, as cheaply as a Go
// server can: the floor under any request/response protocol.
func serveEcho(path string) error {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return err
	}
	os.Chmod(path, 0o666)
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					c.Write(buf[:n])
				}
			}()
		}
	}()
	return nil
}

type sourceList []discover.Container

func (s sourceList) Run(_ context.Context, sink discover.Sink) error {
	for _, c := range s {
		if err := sink.Prepare(c); err != nil {
			return err
		}
	}
	return nil
}

func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

func printCells(byMode map[string]*cell) {
	base := byMode["uncached"]
	if base == nil {
		base = byMode[variants[0].name]
	}
	for _, c := range byMode {
		sort.Slice(c.lat, func(i, j int) bool { return c.lat[i] < c.lat[j] })
		sort.Slice(c.acq, func(i, j int) bool { return c.acq[i] < c.acq[j] })
	}
	first := byMode[variants[0].name]
	fmt.Printf("%-8s threads=%d\n", first.scenario, first.threads)
	fmt.Printf("  %-16s %6s %10s %10s %10s %12s %12s %9s %12s\n", "mode", "n", "p50", "p90", "p99", "p50 vs unc.", "p99 vs unc.", "no-write", "acquire p50")
	for _, v := range variants {
		c := byMode[v.name]
		p50, p90, p99 := pct(c.lat, .5), pct(c.lat, .9), pct(c.lat, .99)
		fmt.Printf("  %-16s %6d %10s %10s %10s %11.1fx %11.1fx %8.1f%%",
			v.name, len(c.lat), us(p50), us(p90), us(p99),
			float64(pct(base.lat, .5))/float64(max(p50, 1)), float64(pct(base.lat, .99))/float64(max(p99, 1)),
			100*float64(c.noWrite)/float64(max(c.total, 1)))
		fmt.Printf(" %12s", us(pct(c.acq, .5)))
		if c.errors > 0 {
			fmt.Printf("  (%d errors, first: %s)", c.errors, c.firstErr)
		}
		fmt.Println()
	}
	fmt.Println()
}

func us(d time.Duration) string { return fmt.Sprintf("%.1fus", float64(d.Nanoseconds())/1000) }

// The client side: a runtime stand-in in one container.

type job struct {
	Threads  int    `json:"threads"`
	N        int    `json:"n"`
	Sporadic bool   `json:"sporadic"`
	Burst    int    `json:"burst"`
	Quota    uint32 `json:"quota"`
	Share    int64  `json:"shareNS,omitempty"`
	Echo     string `json:"echo,omitempty"`
}

type jobResult struct {
	LatNS    []int64 `json:"lat"`
	AcqNS    []int64 `json:"acq"`
	FirstErr string  `json:"firstErr,omitempty"`
	NoWrite  int     `json:"noWrite"`
	Total    int     `json:"total"`
	Errors   int     `json:"errors"`
	SharePct float64 `json:"sharePct"`
	Err      string  `json:"err,omitempty"`
}

type benchClient struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startClient(h *cgroup.Hierarchy, rel, socket string, linger time.Duration) (*benchClient, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "SLOTBENCH_CLIENT=1", "SLOTBENCH_SOCKET="+socket, "SLOTBENCH_LINGER="+linger.String())
	cmd.Stderr = os.Stderr
	// A client runs in a PID namespace of its own, as in a pod: on v1 the
	// agent passes placement fds only to such peers (docs/security.md).
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
			if c == nil && j.Echo == "" {
				var err error
				linger, _ := time.ParseDuration(os.Getenv("SLOTBENCH_LINGER"))
				if c, err = client.Dial(os.Getenv("SLOTBENCH_SOCKET"), client.Options{Name: "slotbench", Wait: time.Second, Linger: linger}); err != nil {
					r.Err = err.Error()
					enc.Encode(r)
					continue
				}
			}
			if j.Share > 0 {
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

func runJob(c *client.Client, j job) jobResult {
	var mu sync.Mutex
	var r jobResult
	var wg sync.WaitGroup
	for t := 0; t < j.Threads; t++ {
		wg.Add(1)
		worker(t) <- func() {
			defer wg.Done()
			lat := make([]int64, 0, j.N)
			acq := make([]int64, 0, j.N)
			noWrite, errs := 0, 0
			firstErr := ""
			for i := 0; i < j.N; i++ {
				if j.Sporadic && i%j.Burst == 0 {
					time.Sleep(time.Duration(20+rand.IntN(11)) * time.Millisecond)
				}
				start := time.Now()
				l, err := c.Acquire(j.Quota, "bench", "")
				a := time.Since(start)
				if err == nil {
					_, err = l.Release(slotv1.InvocationOK)
				}
				d := time.Since(start)
				if err != nil {
					if errs == 0 {
						firstErr = err.Error()
					}
					errs++
					continue
				}
				lat = append(lat, d.Nanoseconds())
				acq = append(acq, a.Nanoseconds())
				if l.Place == slotv1.PlaceNone && (l.Outcome == slotv1.OutcomeAffinityHit || l.Outcome == slotv1.OutcomeCacheHit) || l.Reused {
					noWrite++
				}
			}
			mu.Lock()
			r.LatNS = append(r.LatNS, lat...)
			r.AcqNS = append(r.AcqNS, acq...)
			if r.FirstErr == "" {
				r.FirstErr = firstErr
			}
			r.NoWrite += noWrite
			r.Total += len(lat)
			r.Errors += errs
			mu.Unlock()
		}
	}
	wg.Wait()
	return r
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
