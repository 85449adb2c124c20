package main

// slotbench -lend: the shape of "Tell me when you are sleepy and what may
// wake you up!" (SoCC'21) against lending (docs/lending.md). One container
// with a fixed CPU limit runs invocations that wait on I/O for a share of
// their time beside CPU-bound ones, admission overcommitted 1:1 or 3:1,
// with lending off and on. Every invocation asks for the same quota and
// does the same CPU work; a waiting one does it in segments, each followed
// by a wait as long as the segment takes at the quota times wait/(1-wait),
// so its slot idles that share of its quota; with lending it says SLEEP before each wait and
// WAKE after (client.Lease.Sleep, Wake). Threads run closed loops (acquire,
// work, release) with twice as many threads as the budget admits at once,
// so admission decides the throughput; a container, a client process and
// an agent pool per (overcommit, lend ratio), rounds alternating between
// the lend ratios.

import (
	"bufio"
	"fmt"
	"log/slog"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/pool"
)

// lendParams are the -lend flags.
type lendParams struct {
	limit      uint32        // the container's CPU limit, millicores
	quota      uint32        // every invocation's quota
	cpuWork    time.Duration // CPU time of every invocation
	segments   int           // compute segments of a waiting invocation
	waits      []int         // wait shares, percent
	overcommit []int         // admission overcommit factors
	ratios     []float64     // lend ratios; 0 is lending off
	cell       time.Duration // measured time per cell and round
	rounds     int
	periodUS   uint32
	// containerPeriod is the CFS period of the container's limit (the
	// kubelet's is 100 ms).
	containerPeriod time.Duration
	// chain: the depth of the chain case (0: none); localWaits: the wait
	// shares also run with local leasing.
	chain      int
	localWaits []int
}

// lendCase is one workload at one overcommit, a group of rows over the lend
// ratios.
type lendCase struct {
	wait  int // percent of their time waiting invocations wait
	chain int // else: chains of this depth, each caller asleep in its call
	over  int
	local bool // local leasing (a HOLD lease sleeps for the invocation)
}

func (c lendCase) String() string {
	s := fmt.Sprintf("%d%% wait", c.wait)
	if c.chain > 0 {
		s = fmt.Sprintf("chains of %d", c.chain)
	}
	if c.local {
		s += ", local leasing"
	}
	return s
}

// lendJob is one cell for the client: closed loops on Threads threads, of
// which IOThreads wait Wait percent of their time, for Duration.
type lendJob struct {
	Threads, IOThreads int
	Quota              uint32
	CPUWorkNS          int64
	Segments           int
	WaitPct            int
	// Chain > 0: the waiting threads run chains of this depth instead
	// (WaitPct unused).
	Chain      int
	DurationNS int64
}

// lendResult is what the client measured in one cell.
type lendResult struct {
	Completed int
	ElapsedNS int64
	CPULatNS  []int64 // CPU-bound invocations, acquire to release
	IOLatNS   []int64
	WakeNS    []int64 // WAKE sent to answered (the agent cut the borrowers)
	// UsedNS is the CPU the invocations' slots used.
	UsedNS float64
	// SleepsRefused counts SLEEPs over the agent's rate (the lease stayed
	// awake).
	SleepsRefused int
	Errors        int
	FirstErr      string
}

// lendCell accumulates a cell over rounds.
type lendCell struct {
	r       lendResult
	elapsed time.Duration
	// wakeLe, wakeAgent: the bounds of cpuslot_wake_to_quota_seconds'
	// buckets and the cumulative counts the cell added.
	wakeLe, wakeAgent []float64
	lends, cuts       uint64
	// charged sums, over rounds, the mean share of the budget charged.
	charged float64
	// containerNS is the CPU of the whole container, slots and the
	// client's other threads.
	containerNS float64
	// periods, throttled: the container's CFS periods and those in which
	// its limit stopped it.
	periods, throttled uint64
}

// containerCPU is the CPU the container's cgroup has used (cgroup v1
// cpuacct.usage, v2 cpu.stat usage_usec).
func containerCPU(h *cgroup.Hierarchy, rel string) time.Duration {
	if h.Version == 2 {
		b, err := os.ReadFile(filepath.Join(h.CPURoot, rel, "cpu.stat"))
		if err != nil {
			return 0
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, _ := strconv.ParseInt(v, 10, 64)
				return time.Duration(us) * time.Microsecond
			}
		}
		return 0
	}
	b, err := os.ReadFile(filepath.Join(h.AcctRoot, rel, "cpuacct.usage"))
	if err != nil {
		return 0
	}
	ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(ns)
}

// containerThrottling is the container cgroup's CFS periods and throttled
// periods so far (nr_periods, nr_throttled of cpu.stat, v1 and v2 alike).
func containerThrottling(h *cgroup.Hierarchy, rel string) (periods, throttled uint64) {
	b, _ := os.ReadFile(filepath.Join(h.CPURoot, rel, "cpu.stat"))
	return parseThrottling(b)
}

func parseThrottling(cpuStat []byte) (periods, throttled uint64) {
	for _, line := range strings.Split(string(cpuStat), "\n") {
		k, v, _ := strings.Cut(line, " ")
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "nr_periods":
			periods = n
		case "nr_throttled":
			throttled = n
		}
	}
	return periods, throttled
}

// setContainerLimit gives the container a CPU limit of milli with CFS
// period period (SetLimit's is the kubelet's default, 100 ms).
func setContainerLimit(h *cgroup.Hierarchy, rel string, milli uint32, period time.Duration) error {
	us := period.Microseconds()
	quota := int64(milli) * us / 1000
	if h.Version == 2 {
		return os.WriteFile(filepath.Join(h.CPURoot, rel, "cpu.max"), []byte(fmt.Sprintf("%d %d", quota, us)), 0)
	}
	// The quota first: it may be lowered below the old period's, never raised
	// above the new one.
	dir := filepath.Join(h.CPURoot, rel)
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(quota, 10)), 0); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.FormatInt(us, 10)), 0)
}

// sampleCharged samples the share of pool name's budget charged (awake
// leases' grants and sleepers' unlent part) every 5 ms until the returned
// function is called, which returns its mean.
func sampleCharged(a *agent.Agent, name string) func() float64 {
	done := make(chan struct{})
	mean := make(chan float64)
	go func() {
		var sum float64
		n := 0
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				mean <- sum / float64(max(n, 1))
				return
			case <-tick.C:
				if s := summaryOf(a, name); s.BudgetMilli > 0 {
					sum += float64(s.UsedMilli) / float64(s.BudgetMilli)
					n++
				}
			}
		}
	}()
	return func() float64 { close(done); return <-mean }
}

func lendContainer(over int, ratio float64, local bool) string {
	name := fmt.Sprintf("over%d-lend%s", over, strconv.FormatFloat(ratio, 'f', -1, 64))
	if local {
		name += "-local"
	}
	return name
}

// lendCases are the workloads of p, in the table's order.
func lendCases(p lendParams) []lendCase {
	var out []lendCase
	for _, wait := range p.waits {
		for _, over := range p.overcommit {
			out = append(out, lendCase{wait: wait, over: over})
		}
	}
	if p.chain > 0 {
		for _, over := range p.overcommit {
			out = append(out, lendCase{chain: p.chain, over: over})
		}
	}
	for _, wait := range p.localWaits {
		for _, over := range p.overcommit {
			out = append(out, lendCase{wait: wait, over: over, local: true})
		}
	}
	return out
}

func lendBench(p lendParams) error {
	tb, err := newTestbed("lend")
	if err != nil {
		return err
	}
	defer tb.close()
	h := tb.h
	cfg := tb.config()
	cfg.LogLevel = "warn"
	var containers []discover.Container
	rels := map[string]string{}
	made := map[string]bool{}
	for _, lc := range lendCases(p) {
		for _, ratio := range p.ratios {
			name := lendContainer(lc.over, ratio, lc.local)
			if made[name] {
				continue
			}
			made[name] = true
			rel, err := tb.container(name)
			if err != nil {
				return err
			}
			rels[name] = rel
			if err := setContainerLimit(h, rel, p.limit, p.containerPeriod); err != nil {
				return fmt.Errorf("CPU limit of %s: %w", name, err)
			}
			pc, err := cfg.Settings()
			if err != nil {
				return err
			}
			admitted := int(p.limit) * lc.over / int(p.quota)
			pc.Prewarm = map[uint32]int{p.quota: 2 * admitted}
			pc.MaxSlots = 2*admitted + 4
			pc.Overcommit = float64(lc.over)
			pc.LendRatio = ratio
			pc.Policy = admission.Queue
			pc.PeriodUS = p.periodUS
			containers = append(containers, discover.Container{Name: name, CgroupPath: rel, Pool: &pc})
		}
	}
	if err := favor(h, tb.root); err != nil {
		return err
	}
	if err := tb.favorAgent(); err != nil {
		return fmt.Errorf("the agent's cgroup: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, err := agent.New(cfg, log)
	if err != nil {
		return err
	}
	if err := tb.run(a, sourceList(containers)); err != nil {
		return err
	}
	clients := map[string]*benchClient{}
	for _, c := range containers {
		bc, err := startClient(h, c.CgroupPath, cfg.Socket, variant{name: c.Name, local: strings.HasSuffix(c.Name, "-local")})
		if err != nil {
			return fmt.Errorf("client for %s: %w", c.Name, err)
		}
		defer bc.close()
		clients[c.Name] = bc
	}

	fmt.Printf("slotbench -lend: %s, kernel %s, %d CPUs\n", h, kernelRelease(), runtime.NumCPU())
	fmt.Printf("one container, CPU limit %dm (CFS period %v); every invocation %dm and %v of CPU; waiting ones in %d segments; slot period %v;\n",
		p.limit, p.containerPeriod, p.quota, p.cpuWork, p.segments, time.Duration(p.periodUS)*time.Microsecond)
	fmt.Printf("closed loops on twice the threads the budget admits, 3/4 waiting (or in chains of %d), 1/4 CPU-bound; admission queue; thread leases unless local leasing;\n", p.chain)
	fmt.Printf("%d rounds of %v per cell after a warm-up, lend ratios alternating; 0 = lending off\n\n", p.rounds, p.cell)

	cells := map[string]*lendCell{}
	key := func(lc lendCase, ratio float64) string { return fmt.Sprintf("%v/%d/%v", lc, lc.over, ratio) }
	for _, lc := range lendCases(p) {
		admitted := int(p.limit) * lc.over / int(p.quota)
		threads := 2 * admitted
		j := lendJob{Threads: threads, IOThreads: threads * 3 / 4, Quota: p.quota, CPUWorkNS: p.cpuWork.Nanoseconds(),
			Segments: p.segments, WaitPct: lc.wait, Chain: lc.chain}
		for round := -1; round < p.rounds; round++ {
			for _, ratio := range p.ratios {
				name := lendContainer(lc.over, ratio, lc.local)
				j.DurationNS = p.cell.Nanoseconds()
				if round < 0 {
					j.DurationNS = min(p.cell, time.Second).Nanoseconds() // warm-up, not counted
				}
				_, before := wakeBuckets(a)
				sumBefore := summaryOf(a, name)
				stop := sampleCharged(a, name)
				cpu0 := containerCPU(h, rels[name])
				periods0, throttled0 := containerThrottling(h, rels[name])
				r, err := clients[name].runLend(j)
				charged := stop()
				ccpu := containerCPU(h, rels[name]) - cpu0
				periods1, throttled1 := containerThrottling(h, rels[name])
				if err != nil {
					return fmt.Errorf("%s, %v: %w", name, lc, err)
				}
				if round < 0 {
					continue
				}
				le, after := wakeBuckets(a)
				sumAfter := summaryOf(a, name)
				k := key(lc, ratio)
				c := cells[k]
				if c == nil {
					c = &lendCell{}
					cells[k] = c
				}
				c.wakeLe = le
				c.add(r, before, after)
				c.charged += charged
				c.containerNS += float64(ccpu)
				c.periods += periods1 - periods0
				c.throttled += throttled1 - throttled0
				c.lends += sumAfter.Lends - sumBefore.Lends
				c.cuts += sumAfter.Cuts - sumBefore.Cuts
			}
		}
	}

	fmt.Printf("| workload | overcommit | lend ratio | invocations/s | vs off | CPU-bound p50 | CPU-bound p99 | p99 vs off | waiting p50 / p99 | WAKE answered p50 / p99 | agent wake-to-quota p50 / p99 | limit used (slots / container) | container throttled | budget charged | lends | borrowers cut | queue timeouts, errors |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, lc := range lendCases(p) {
		off := cells[key(lc, p.ratios[0])]
		for _, ratio := range p.ratios {
			c := cells[key(lc, ratio)]
			tput := float64(c.r.Completed) / c.elapsed.Seconds()
			offTput := float64(off.r.Completed) / off.elapsed.Seconds()
			sortNS(c.r.CPULatNS)
			sortNS(c.r.IOLatNS)
			sortNS(c.r.WakeNS)
			sortNS(off.r.CPULatNS)
			wakes := "-"
			agentWakes := "-"
			if len(c.r.WakeNS) > 0 {
				wakes = fmt.Sprintf("%s / %s", ms(pctNS(c.r.WakeNS, .5)), ms(pctNS(c.r.WakeNS, .99)))
				agentWakes = fmt.Sprintf("<= %s / <= %s", bucketPct(c.wakeLe, c.wakeAgent, .5), bucketPct(c.wakeLe, c.wakeAgent, .99))
			}
			errs := strconv.Itoa(c.r.Errors)
			if c.r.Errors > 0 {
				errs += " (" + c.r.FirstErr + ")"
			}
			if c.r.SleepsRefused > 0 {
				errs += fmt.Sprintf("; %d SLEEPs refused (rate)", c.r.SleepsRefused)
			}
			fmt.Printf("| %v | %d:1 | %v | %.1f | %.2fx | %s | %s | %.2fx | %s / %s | %s | %s | %.0f%% / %.0f%% | %.0f%% | %.0f%% | %d | %d | %s |\n",
				lc, lc.over, ratio, tput, tput/offTput,
				ms(pctNS(c.r.CPULatNS, .5)), ms(pctNS(c.r.CPULatNS, .99)),
				float64(pctNS(c.r.CPULatNS, .99))/float64(max(pctNS(off.r.CPULatNS, .99), 1)),
				ms(pctNS(c.r.IOLatNS, .5)), ms(pctNS(c.r.IOLatNS, .99)), wakes, agentWakes,
				100*c.r.UsedNS/(float64(p.limit)/1000*float64(c.elapsed.Nanoseconds())),
				100*c.containerNS/(float64(p.limit)/1000*float64(c.elapsed.Nanoseconds())),
				100*float64(c.throttled)/float64(max(c.periods, 1)), 100*c.charged/float64(p.rounds),
				c.lends, c.cuts, errs)
		}
	}
	return nil
}

// favor gives the run's cgroup the largest CPU weight, so that the
// container's CPU limit binds rather than other work on a loaded machine
// (the limit still caps what the run takes).
func favor(h *cgroup.Hierarchy, rel string) error {
	file, value := "cpu.shares", "262144"
	if h.Version == 2 {
		file, value = "cpu.weight", "10000"
	}
	return os.WriteFile(filepath.Join(h.CPURoot, rel, file), []byte(value), 0)
}

func (c *lendCell) add(r *lendResult, before, after []float64) {
	c.r.Completed += r.Completed
	c.elapsed += time.Duration(r.ElapsedNS)
	c.r.CPULatNS = append(c.r.CPULatNS, r.CPULatNS...)
	c.r.IOLatNS = append(c.r.IOLatNS, r.IOLatNS...)
	c.r.WakeNS = append(c.r.WakeNS, r.WakeNS...)
	c.r.UsedNS += r.UsedNS
	c.r.SleepsRefused += r.SleepsRefused
	if c.r.Errors == 0 {
		c.r.FirstErr = r.FirstErr
	}
	c.r.Errors += r.Errors
	if c.wakeAgent == nil {
		c.wakeAgent = make([]float64, len(after))
	}
	for i := range after {
		c.wakeAgent[i] += after[i] - before[i]
	}
}

func ms(ns int64) string { return fmt.Sprintf("%.2f ms", float64(ns)/1e6) }

func summaryOf(a *agent.Agent, name string) pool.Summary {
	for _, s := range a.Summaries() {
		if s.Name == name {
			return s
		}
	}
	return pool.Summary{}
}

// wakeBuckets reads the bounds and cumulative counts of the agent's
// cpuslot_wake_to_quota_seconds buckets from its /metrics.
func wakeBuckets(a *agent.Agent) (le, counts []float64) {
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, `cpuslot_wake_to_quota_seconds_bucket{le="`)
		if !ok {
			continue
		}
		bound, value, _ := strings.Cut(rest, `"} `)
		b, err1 := strconv.ParseFloat(bound, 64)
		v, err2 := strconv.ParseFloat(value, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		le, counts = append(le, b), append(counts, v)
	}
	return le, counts
}

// bucketPct is the upper bound of the bucket holding quantile q of the
// cumulative counts.
func bucketPct(le, cum []float64, q float64) string {
	if len(cum) == 0 || cum[len(cum)-1] == 0 {
		return "-"
	}
	want := q * cum[len(cum)-1]
	for i, n := range cum {
		if n >= want {
			if math.IsInf(le[i], 1) {
				return "inf"
			}
			return ms(int64(le[i] * 1e9))
		}
	}
	return "inf"
}

func (c *benchClient) runLend(j lendJob) (*lendResult, error) {
	r, err := c.run(job{Lend: &j})
	if err != nil {
		return nil, err
	}
	if r.Lend == nil {
		return nil, fmt.Errorf("no lend result")
	}
	return r.Lend, nil
}
