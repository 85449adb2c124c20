// Command slotbench measures what a CPU slot costs per invocation, side by
// side for the four pool modes and local leasing, in one run on this
// machine's kernel, against the floor: one write of "0" to a slot fd.
//
// One in-process agent serves a container per variant. In each container a
// client process (this binary, re-executed) plays a runtime: its locked OS
// threads acquire a slot, are placed, and release it, through the real
// socket (local leasing: through the client's slot table, asking the agent
// on a miss only). Rounds alternate between variants so that machine noise
// hits all of them alike. Each thread runs one action at one quota (150m,
// 333m, 750m, 1200m by thread) and switches to another action and quota for
// a tenth of its invocations. Steady arrivals run back to back; sporadic
// ones pause 15-35 ms after every burst of 3, which is when the kernel's
// cgroup lock makes numeric-TID moves slow. The floor variant is a thread
// that writes "0" to an already open slot fd (every placement fd of the
// slot), alternating between two slots, with the same arrivals.
//
//	slotbench                    # on this machine's hierarchy
//	slotbench -vm                # in the cgroup v2 VM, without and with favordynmods
//	slotbench -scale             # one agent, 250 containers x 64 slots (scale.go)
//	slotbench -lend -rounds 3    # lending off and on, waiting invocations or chains beside CPU-bound ones (lend.go)
//	slotbench -floods            # a victim container's latency under tenants' floods (floods.go)
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/pool"
	"github.com/cpuslot/cpuslot/internal/settings"
	"github.com/cpuslot/cpuslot/test/vm"
)

var modes = []pool.Mode{pool.Uncached, pool.CacheEager, pool.CacheLazy, pool.Affinity}

// variant is one row of the comparison: a pool mode, whether the client
// keeps leases between invocations (client.Options.Linger), and whether it
// leases locally; each local or floor variant has a container of its own.
type variant struct {
	name      string
	mode      pool.Mode
	linger    time.Duration
	local     bool
	floor     bool
	container string
}

var variants []variant

type params struct {
	steadyN, sporadicN   int
	threads, sporThreads []int
	rounds               int
	burst                int
	pauseMin, pauseMax   time.Duration
	quotas               []uint32
	switchP              float64
	share                time.Duration
}

func parseList(flagName, s string, min int) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < min {
			fatal(fmt.Errorf("-%s %q", flagName, s))
		}
		out = append(out, n)
	}
	return out
}

func main() {
	steadyN := flag.Int("steady", 2000, "invocations per thread per cell, steady arrivals")
	sporadicN := flag.Int("sporadic", 300, "invocations per thread per cell, sporadic arrivals")
	threads := flag.String("threads", "1,4", "client thread counts, steady arrivals")
	sporThreads := flag.String("sporadic-threads", "1,3,4", "client thread counts, sporadic arrivals")
	rounds := flag.Int("rounds", 4, "rounds per cell (variants alternate between rounds)")
	burst := flag.Int("burst", 3, "sporadic: invocations between pauses")
	pauseMin := flag.Duration("pause-min", 15*time.Millisecond, "sporadic: shortest pause")
	pauseMax := flag.Duration("pause-max", 35*time.Millisecond, "sporadic: longest pause")
	quotaList := flag.String("quotas", "150,333,750,1200", "quotas (millicores) the threads run at, one per thread in turn")
	switchP := flag.Float64("switch", 0.1, "share of invocations that switch to another action and quota")
	share := flag.Duration("share", 10*time.Second, "also measure a CPU-bound thread in a 250m slot for this long (0: skip)")
	modeList := flag.String("modes", "uncached,cache-eager,cache-lazy,affinity", "modes to compare (ratios need uncached)")
	linger := flag.Duration("linger", 100*time.Millisecond, "also run affinity with a client that keeps leases this long (0: skip)")
	local := flag.Bool("local", true, "also run local leasing (the client's default) in a container of its own")
	cpuprofile := flag.String("cpuprofile", "", "write the agent side's CPU profile here")
	inVM := flag.Bool("vm", false, "run inside the cgroup v2 VM, once without and once with favordynmods (-lend: once, without)")
	scale := flag.Bool("scale", false, "measure one agent serving many containers instead (see -containers)")
	lend := flag.Bool("lend", false, "measure lending instead (lend.go): waiting invocations beside CPU-bound ones, lending off and on")
	var lp lendParams
	flag.DurationVar(&lp.cpuWork, "lend-cpu", 20*time.Millisecond, "-lend: CPU time of every invocation")
	flag.IntVar(&lp.segments, "lend-segments", 4, "-lend: compute segments of a waiting invocation, each followed by a wait")
	lendWaits := flag.String("lend-waits", "25,50,75", "-lend: the share of their time waiting invocations wait, percent")
	lendOver := flag.String("lend-overcommit", "1,3,6", "-lend: admission overcommit factors")
	flag.IntVar(&lp.chain, "lend-chain", 3, "-lend: also run chains of this depth in place of the waiting invocations, each caller asleep in its synchronous call (0: none)")
	lendLocal := flag.String("lend-local-waits", "50", "-lend: the wait shares also run with local leasing (empty: none)")
	lendRatios := flag.String("lend-ratios", "0,0.5,1", "-lend: lend ratios (0: lending off, the baseline)")
	lendLimit := flag.Int("lend-limit", 500, "-lend: the container's CPU limit, millicores")
	lendQuota := flag.Int("lend-quota", 125, "-lend: every invocation's quota, millicores")
	flag.DurationVar(&lp.cell, "lend-cell", 6*time.Second, "-lend: measured time per cell and round")
	lendPeriod := flag.Duration("lend-period", 10*time.Millisecond, "-lend: the slots' CFS period")
	flag.DurationVar(&lp.containerPeriod, "lend-container-period", 100*time.Millisecond, "-lend: the CFS period of the container's limit (the kubelet's default: 100ms)")
	var sp scaleParams
	flag.IntVar(&sp.containers, "containers", 250, "-scale: containers served")
	flag.IntVar(&sp.slots, "slots", 64, "-scale: slots pre-warmed per container")
	flag.DurationVar(&sp.idle, "idle", 20*time.Second, "-scale: how long to measure the idle agent's CPU")
	flag.IntVar(&sp.hellos, "hellos", 500, "-scale: connect + HELLO samples per phase")
	flag.IntVar(&sp.acquires, "acquires", 5000, "-scale: ACQUIRE samples per phase")
	flag.IntVar(&sp.flood, "flood", 5000, "-scale: stalled connections the flooding container opens")
	flag.IntVar(&sp.floodProcs, "flood-procs", 100, "-scale: processes of the flooding container the connections are spread over")
	flag.IntVar(&sp.outsideProcs, "outside-procs", 70, "-scale: processes outside every served container, each its own user and cgroup, holding idle connections without HELLO (0: no such phase)")
	flag.IntVar(&sp.outsideConns, "outside-conns", 63, "-scale: idle connections each of -outside-procs holds, reopening any closed")
	floods := flag.Bool("floods", false, "measure a victim container's latency under tenants' floods instead (floods.go)")
	fp := floodParams{hellos: 200, acquires: 2000}
	flag.IntVar(&fp.pinContainers, "pin-containers", 20, "-floods: new containers pinning connections")
	flag.IntVar(&fp.pinConns, "pin-conns", 256, "-floods: connections each pinning container opens before its HELLOs")
	flag.IntVar(&fp.churnUsers, "churn-users", 20, "-floods: users in one cgroup connecting and closing")
	flag.IntVar(&fp.churnConns, "churn-conns", 8, "-floods: connect loops of each churning user")
	flag.IntVar(&fp.churnCPU, "churn-cpu", 0, "-floods: CPU limit of the churning users' cgroup in millicores (0: none)")
	flag.BoolVar(&fp.churnRoot, "churn-root", false, "-floods: the churning users are root (a container without a user namespace)")
	flag.BoolVar(&fp.churnUnserved, "churn-unserved", false, "-floods: the churning users connect to a socket no one accepts on (the control: their CPU without the agent's work)")
	flag.IntVar(&fp.flappers, "flappers", 8, "-floods: processes flapping SLEEP/WAKE")
	flag.IntVar(&fp.releasers, "releasers", 8, "-floods: processes sending one-way RELEASEs")
	flag.IntVar(&fp.leasers, "leasers", 0, "-floods: processes looping agent-placed ACQUIRE and RELEASE (granted work, paced by limits.placementRate)")
	flag.IntVar(&fp.placementRate, "placement-rate", 0, "-floods: the agent's limits.placementRate (0: its default)")
	flag.IntVar(&fp.again, "again", 0, "-floods: also probe the victim this many times more with no flood (the p99 ratios' noise floor)")
	flag.Parse()
	if os.Getenv("SLOTBENCH_CLIENT") != "" {
		clientMain()
		return
	}
	if role := os.Getenv("SLOTBENCH_SCALE"); role != "" {
		scaleChild(role)
		return
	}
	if *cpuprofile != "" && !*inVM {
		f, err := os.Create(*cpuprofile)
		fatal(err)
		fatal(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	if *floods {
		fatal(floodBench(fp))
		return
	}
	if *scale {
		fatal(scaleBench(sp))
		return
	}
	if *lend {
		lp.limit, lp.quota, lp.rounds = uint32(*lendLimit), uint32(*lendQuota), *rounds
		lp.periodUS = uint32(lendPeriod.Microseconds())
		lp.waits = parseList("lend-waits", *lendWaits, 1)
		lp.overcommit = parseList("lend-overcommit", *lendOver, 1)
		lp.ratios = parseFloats("lend-ratios", *lendRatios)
		if *lendLocal != "" {
			lp.localWaits = parseList("lend-local-waits", *lendLocal, 1)
		}
		for _, w := range append(lp.waits, lp.localWaits...) {
			if w >= 100 {
				fatal(fmt.Errorf("-lend-waits: %d%% is not below 100", w))
			}
		}
		if lp.ratios[0] != 0 || lp.quota == 0 || lp.limit < lp.quota || lp.segments < 1 || lp.chain < 0 ||
			lp.chain > 2*int(lp.limit/lp.quota)*3/4 ||
			lp.containerPeriod < time.Millisecond || lp.containerPeriod > time.Second {
			fatal(fmt.Errorf("-lend: want the first ratio 0 (the baseline), a quota of at most the limit, segments, chains no deeper than the waiting threads at 1:1, and a container period from 1ms to 1s"))
		}
		if *inVM {
			// One boot: the lending cells are long, the VM slow.
			fatal(runInVM(os.Args[1:], ""))
			return
		}
		fatal(lendBench(lp))
		return
	}
	p := params{steadyN: *steadyN, sporadicN: *sporadicN, rounds: *rounds, burst: max(1, *burst), share: *share,
		pauseMin: *pauseMin, pauseMax: max(*pauseMin, *pauseMax), switchP: *switchP,
		threads: parseList("threads", *threads, 1), sporThreads: parseList("sporadic-threads", *sporThreads, 1)}
	for _, q := range parseList("quotas", *quotaList, 1) {
		p.quotas = append(p.quotas, uint32(q))
	}
	modes = nil
	for _, s := range strings.Split(*modeList, ",") {
		m, err := settings.ParseMode(strings.TrimSpace(s))
		fatal(err)
		modes = append(modes, m)
		variants = append(variants, variant{name: string(m), mode: m, container: string(m)})
		if m == pool.Affinity && *linger > 0 {
			variants = append(variants, variant{name: "affinity+linger", mode: m, linger: *linger, container: string(m)})
		}
	}
	if *local {
		variants = append(variants, variant{name: "local", mode: pool.Affinity, local: true, container: "local"})
	}
	variants = append(variants, variant{name: "floor", mode: pool.Affinity, floor: true, container: "floor"})
	if *inVM {
		fatal(runInVM(os.Args[1:], "", "favordynmods"))
		return
	}
	fatal(bench(p))
}

func fatal(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "slotbench:", err)
		pprof.StopCPUProfile() // what was profiled is kept
		os.Exit(1)
	}
}

// runInVM boots the test VM with this (static) binary and runs the same
// benchmark inside, once per cgroup2 mount option set in mounts.
func runInVM(args []string, mounts ...string) error {
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
	for _, mount := range mounts {
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
	// What a placement costs, not the pace on a container's placements
	// (limits.placementRate, which -floods -leasers measures).
	cfg.Limits.PlacementRate = 1 << 30
	maxThreads := 0
	for _, n := range append(p.threads, p.sporThreads...) {
		maxThreads = max(maxThreads, n)
	}
	var containers []discover.Container
	made := map[string]bool{}
	for _, v := range variants {
		if made[v.container] {
			continue
		}
		made[v.container] = true
		m := v.mode
		rel, err := tb.container(v.container)
		if err != nil {
			return err
		}
		pc, err := cfg.Settings()
		if err != nil {
			return err
		}
		pc.Mode = m
		// Every quota a thread may switch to, for every thread.
		pc.Prewarm = map[uint32]int{}
		for _, q := range p.quotas {
			pc.Prewarm[q] = maxThreads
		}
		pc.MaxSlots = 2 * maxThreads * len(p.quotas)
		switch {
		case m == pool.Uncached:
			pc.Prewarm = nil
		case v.floor:
			pc.Prewarm = map[uint32]int{p.quotas[0]: 2} // the two slots the floor alternates between
		}
		containers = append(containers, discover.Container{Name: v.container, CgroupPath: rel, Pool: &pc})
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
		c, err := startClient(h, tb.root+"/"+v.container, cfg.Socket, v)
		if err != nil {
			return fmt.Errorf("client for %s: %w", v.name, err)
		}
		defer c.close()
		clients[v.name] = c
	}
	floorFDs, err := floorSlots(h, tb.root+"/floor")
	if err != nil {
		return err
	}

	fdm := "n/a (v1)"
	if h.Version == 2 {
		fdm = strconv.FormatBool(h.FavorDynMods)
	}
	fmt.Printf("slotbench: %s, kernel %s, favordynmods %s, %d CPUs\n", h, kernelRelease(), fdm, runtime.NumCPU())
	fmt.Printf("per invocation: acquire + placement + release through the agent socket; %d rounds per cell after one uncounted warm-up round, variants alternating\n\n", p.rounds)

	floor, err := clients["floor"].run(job{Echo: echo, N: p.steadyN})
	if err != nil {
		return fmt.Errorf("echo: %w", err)
	}
	sortNS(floor.LatNS)
	fmt.Printf("IPC floor, a bare 64-byte round trip to a Go server on the same machine: p50 %s  p90 %s  p99 %s\n\n",
		us(time.Duration(pctNS(floor.LatNS, .5))), us(time.Duration(pctNS(floor.LatNS, .9))), us(time.Duration(pctNS(floor.LatNS, .99))))

	if c := clients["local"]; c != nil {
		res, err := c.run(job{Probe: true})
		if err != nil {
			return err
		}
		if !res.Local {
			fmt.Printf("NOTE: the agent did not grant LOCAL: the local variant ran the per-thread path\n\n")
		}
	}
	fmt.Printf("arrivals: each thread runs one action at its quota (%v by thread), %.0f%% of invocations switch to another; sporadic: bursts of %d, pauses %v-%v\n\n",
		p.quotas, 100*p.switchP, p.burst, p.pauseMin, p.pauseMax)
	var summary []string
	for _, scenario := range []string{"steady", "sporadic"} {
		n, threadList := p.steadyN, p.threads
		if scenario == "sporadic" {
			n, threadList = p.sporadicN, p.sporThreads
		}
		for _, threads := range threadList {
			byMode := map[string]*cell{}
			for _, v := range variants {
				byMode[v.name] = &cell{scenario: scenario, threads: threads, name: v.name}
			}
			per := max(1, n/p.rounds)
			// Round -1 warms every variant up and is not counted: slots
			// made or held, a thread's affinity, held slots for each quota
			// a thread may switch to (a runtime pays that once, not per
			// invocation).
			for r := -1; r < p.rounds; r++ {
				order := append([]variant(nil), variants...)
				rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
				for _, v := range order {
					j := job{Threads: threads, N: per, Sporadic: scenario == "sporadic", Burst: p.burst, Quotas: p.quotas, Switch: p.switchP,
						PauseMinNS: p.pauseMin.Nanoseconds(), PauseMaxNS: p.pauseMax.Nanoseconds()}
					if v.floor {
						j.Floor = floorFDs
					}
					res, err := clients[v.name].run(j)
					if err != nil {
						return fmt.Errorf("%s %s: %w", scenario, v.name, err)
					}
					if r < 0 {
						continue
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
			if u, l := byMode["uncached"], byMode["local"]; u != nil && l != nil {
				summary = append(summary, fmt.Sprintf("  %-8s threads=%d: uncached/local p50 %.1fx, p99 %.1fx; local/floor p50 %.2fx, p99 %.2fx",
					scenario, threads, ratio(pct(u.lat, .5), pct(l.lat, .5)), ratio(pct(u.lat, .99), pct(l.lat, .99)),
					ratio(pct(l.lat, .5), pct(byMode["floor"].lat, .5)), ratio(pct(l.lat, .99), pct(byMode["floor"].lat, .99))))
			}
		}
	}
	if len(summary) > 0 {
		fmt.Println("local leasing against uncached and the floor:")
		fmt.Println(strings.Join(summary, "\n"))
	}
	if p.share > 0 {
		name := "local"
		if clients[name] == nil {
			name = "affinity"
		}
		if clients[name] != nil {
			fmt.Println()
			for _, q := range []uint32{150, 250, 750} {
				res, err := clients[name].run(job{Share: p.share.Nanoseconds(), Quota: q})
				if err != nil {
					return err
				}
				fmt.Printf("CPU-bound thread in a %dm slot (%s) for %v: %.1f%% of a core (target %.1f%% +/- 2.5)\n", q, name, p.share, res.SharePct, float64(q)/10)
			}
		}
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

func ratio(a, b time.Duration) float64 { return float64(a) / float64(max(b, 1)) }

func printCells(byMode map[string]*cell) {
	base := byMode["uncached"]
	if base == nil {
		base = byMode[variants[0].name]
	}
	floor := byMode["floor"]
	for _, c := range byMode {
		sort.Slice(c.lat, func(i, j int) bool { return c.lat[i] < c.lat[j] })
		sort.Slice(c.acq, func(i, j int) bool { return c.acq[i] < c.acq[j] })
	}
	first := byMode[variants[0].name]
	fmt.Printf("%-8s threads=%d\n", first.scenario, first.threads)
	fmt.Printf("  %-16s %6s %10s %10s %10s %10s %10s %12s %12s %9s %12s\n", "variant", "n", "p50", "p90", "p99", "p50/floor", "p99/floor",
		"p50 vs unc.", "p99 vs unc.", "no-write", "acquire p50")
	for _, v := range variants {
		c := byMode[v.name]
		p50, p90, p99 := pct(c.lat, .5), pct(c.lat, .9), pct(c.lat, .99)
		fmt.Printf("  %-16s %6d %10s %10s %10s %9.2fx %9.2fx %11.1fx %11.1fx %8.1f%%",
			v.name, len(c.lat), us(p50), us(p90), us(p99), ratio(p50, pct(floor.lat, .5)), ratio(p99, pct(floor.lat, .99)),
			ratio(pct(base.lat, .5), p50), ratio(pct(base.lat, .99), p99),
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
