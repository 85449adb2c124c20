package main

// The scale benchmark: one agent serving many containers with many slots
// each (by default 250 x 64, what the agent's defaults must hold), and the
// latency one container sees while another floods the agent with
// connections, and while processes outside every served container, each
// its own user in its own cgroup, hold idle connections without HELLO.
//
//	slotbench -scale                         # 250 containers x 64 slots
//	slotbench -scale -containers 50 -slots 16
//	slotbench -scale -outside-procs 70 -outside-conns 63

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
)

type scaleParams struct {
	containers, slots int
	idle              time.Duration
	hellos, acquires  int
	flood, floodProcs int
	// outsideProcs processes outside every served container hold
	// outsideConns idle connections each.
	outsideProcs, outsideConns int
}

// probeResult is what the probe client in an unaffected container measured.
type probeResult struct {
	Err     string  `json:"err,omitempty"`
	Hello   []int64 `json:"hello"`   // ns per connect + HELLO
	Acquire []int64 `json:"acquire"` // ns per ACQUIRE round trip
	Refused int     `json:"refused"` // connections closed before HELLO was answered
}

func scaleBench(p scaleParams) error {
	tb, err := newTestbed("scale")
	if err != nil {
		return err
	}
	defer tb.close()
	h := tb.h
	var lim unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	var paths []string
	for i := 0; i < p.containers; i++ {
		rel, err := tb.container(fmt.Sprintf("c%03d", i))
		if err != nil {
			return err
		}
		paths = append(paths, rel)
	}
	cfg := tb.config()
	cfg.Pool.Prewarm = fmt.Sprintf("250m=%d", p.slots)
	cfg.Pool.MaxSlots = max(p.slots, cfg.Pool.MaxSlots)
	cfg.Standalone.Containers = paths
	// Errors only: the flood makes the agent warn per connection.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	a, err := agent.New(cfg, log)
	if err != nil {
		return err
	}
	baseFDs, baseRSS := countFDs(), rssKiB()
	start := time.Now()
	if err := tb.run(a, discover.Static{Hierarchy: h, Cgroups: paths}); err != nil {
		return err
	}
	prepared := time.Since(start)
	slots := 0
	for _, s := range a.Summaries() {
		for _, q := range s.Quotas {
			slots += q.Slots
		}
	}
	runtime.GC()
	fds, rss, gor := countFDs(), rssKiB(), runtime.NumGoroutine()
	cpu0 := cpuTime()
	time.Sleep(p.idle)
	idleCPU := float64(cpuTime()-cpu0) / float64(p.idle)

	fmt.Printf("# slotbench -scale: %s, kernel %s, %d CPUs, RLIMIT_NOFILE %d/%d\n", h, kernelRelease(), runtime.NumCPU(), lim.Cur, lim.Max)
	fmt.Printf("\n| containers | slots | prepared in | agent fds (before start) | RSS (before start) | goroutines | idle CPU over %v |\n|---|---|---|---|---|---|---|\n", p.idle)
	fmt.Printf("| %d | %d | %v | %d (%d) | %.1f MiB (%.1f MiB) | %d | %.2f%% of a core |\n",
		len(a.Summaries()), slots, prepared.Round(time.Millisecond), fds, baseFDs, float64(rss)/1024, float64(baseRSS)/1024, gor, 100*idleCPU)
	if slots != p.containers*p.slots {
		return fmt.Errorf("only %d of %d slots made", slots, p.containers*p.slots)
	}

	// Latency of container 0 while quiet, then while container 1 floods.
	probe := func() (*probeResult, error) {
		var r probeResult
		if err := runScaleChild(h, paths[0], "probe", cfg.Socket, p, &r); err != nil {
			return nil, err
		}
		if r.Err != "" {
			return nil, fmt.Errorf("probe: %s", r.Err)
		}
		return &r, nil
	}
	quiet, err := probe()
	if err != nil {
		return err
	}
	flooders, held, err := startFlood(h, paths[1], cfg.Socket, p.flood, p.floodProcs)
	if err != nil {
		return err
	}
	// Measure once the agent has taken the flood in: its fd count has not
	// changed for 2 s (it holds what its limits let it hold), or after 60 s.
	settle := func() {
		last, since := countFDs(), time.Now()
		for deadline := time.Now().Add(60 * time.Second); time.Since(since) < 2*time.Second && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			if n := countFDs(); n != last {
				last, since = n, time.Now()
			}
		}
	}
	settle()
	floodFDs, floodRSS := countFDs(), rssKiB()
	flooded, perr := probe()
	for _, f := range flooders {
		f.Process.Kill()
		f.Wait()
	}
	if perr != nil {
		return perr
	}
	fmt.Printf("\nContainer c000's latency, quiet and while %d processes of c001 open %d connections, each announcing a frame that never comes (agent then: %d fds, %.1f MiB RSS):\n\n", len(flooders), held, floodFDs, float64(floodRSS)/1024)
	fmt.Printf("| | quiet p50 | quiet p99 | flooded p50 | flooded p99 | p99 ratio |\n|---|---|---|---|---|---|\n")
	row := func(name string, q, f []int64) {
		sortNS(q)
		sortNS(f)
		fmt.Printf("| %s (n=%d) | %s | %s | %s | %s | %.2f |\n", name, len(q), usNS(pctNS(q, 0.5)), usNS(pctNS(q, 0.99)),
			usNS(pctNS(f, 0.5)), usNS(pctNS(f, 0.99)), float64(pctNS(f, 0.99))/float64(max(pctNS(q, 0.99), 1)))
	}
	row("connect + HELLO", quiet.Hello, flooded.Hello)
	row("ACQUIRE", quiet.Acquire, flooded.Acquire)
	if p.outsideProcs == 0 {
		return nil
	}

	// Processes in no served container, each its own user in its own
	// cgroup, hold idle connections without HELLO and reopen any closed.
	var idlers []*exec.Cmd
	defer func() {
		for _, c := range idlers {
			c.Process.Kill()
			c.Wait()
		}
	}()
	held = 0
	for i := 0; i < p.outsideProcs; i++ {
		rel, err := tb.container(fmt.Sprintf("outside%03d", i))
		if err != nil {
			return err
		}
		var r struct {
			Held int `json:"held"`
		}
		cmd := scaleChildCmd("idle", cfg.Socket, scaleParams{flood: p.outsideConns})
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(outsideUID + i), Gid: uint32(outsideUID + i)}}
		if cmd, err = startChildCmd(h, rel, "idle", cmd, &r); err != nil {
			return err
		}
		idlers, held = append(idlers, cmd), held+r.Held
	}
	settle()
	outFDs, outRSS := countFDs(), rssKiB()
	outside, err := probe()
	if err != nil {
		return err
	}
	fmt.Printf("\nContainer c000's latency, quiet and while %d processes outside every served container (each its own user and cgroup) hold %d idle connections without HELLO and reopen any closed (agent then: %d fds, %.1f MiB RSS):\n\n",
		len(idlers), held, outFDs, float64(outRSS)/1024)
	fmt.Printf("| | quiet p50 | quiet p99 | flooded p50 | flooded p99 | p99 ratio |\n|---|---|---|---|---|---|\n")
	row("connect + HELLO", quiet.Hello, outside.Hello)
	row("ACQUIRE", quiet.Acquire, outside.Acquire)
	return nil
}

// outsideUID is the first user id of the outside flooders.
const outsideUID = 20000

func usNS(ns int64) string { return fmt.Sprintf("%.1fus", float64(ns)/1000) }

func countFDs() int {
	e, _ := os.ReadDir("/proc/self/fd")
	return len(e)
}

func rssKiB() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

func scaleChildCmd(role, socket string, p scaleParams) *exec.Cmd {
	exe, _ := os.Executable()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "SLOTBENCH_SCALE="+role, "SLOTBENCH_SOCKET="+socket,
		fmt.Sprintf("SLOTBENCH_HELLOS=%d", p.hellos), fmt.Sprintf("SLOTBENCH_ACQUIRES=%d", p.acquires),
		fmt.Sprintf("SLOTBENCH_FLOOD=%d", p.flood))
	cmd.Stderr = os.Stderr
	return cmd
}

// startScaleChild starts a child in cgroup rel and decodes its first JSON
// line into v; the child runs on (the caller waits for it).
func startScaleChild(h *cgroup.Hierarchy, rel, role, socket string, p scaleParams, v any) (*exec.Cmd, error) {
	return startChildCmd(h, rel, role, scaleChildCmd(role, socket, p), v)
}

// startChildCmd is startScaleChild for a command made by scaleChildCmd.
func startChildCmd(h *cgroup.Hierarchy, rel, role string, cmd *exec.Cmd, v any) (*exec.Cmd, error) {
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := h.StartIn(cmd, rel); err != nil {
		return nil, err
	}
	io.WriteString(in, "go\n") // placed in its cgroup
	line, err := bufio.NewReader(out).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, v)
	}
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("%s child: %w", role, err)
	}
	return cmd, nil
}

// runScaleChild runs a child in cgroup rel to its end and decodes its one
// JSON line.
func runScaleChild(h *cgroup.Hierarchy, rel, role, socket string, p scaleParams, v any) error {
	cmd, err := startScaleChild(h, rel, role, socket, p, v)
	if err != nil {
		return err
	}
	return cmd.Wait()
}

// startFlood starts procs children in rel that open n connections in all,
// announce a large frame on each and stall; it returns once they are open.
func startFlood(h *cgroup.Hierarchy, rel, socket string, n, procs int) ([]*exec.Cmd, int, error) {
	procs = max(procs, 1)
	var cmds []*exec.Cmd
	held := 0
	for i := 0; i < procs; i++ {
		each := n / procs
		if i < n%procs {
			each++
		}
		cmd, k, err := startFlooder(h, rel, socket, each)
		if err != nil {
			for _, c := range cmds {
				c.Process.Kill()
				c.Wait()
			}
			return nil, 0, err
		}
		cmds, held = append(cmds, cmd), held+k
	}
	return cmds, held, nil
}

// startFlooder starts a child in rel that opens n connections and stalls;
// it returns the child and how many it holds.
func startFlooder(h *cgroup.Hierarchy, rel, socket string, n int) (*exec.Cmd, int, error) {
	var r struct {
		Held int `json:"held"`
	}
	cmd, err := startScaleChild(h, rel, "flood", socket, scaleParams{flood: n}, &r)
	if err != nil {
		return nil, 0, err
	}
	return cmd, r.Held, nil
}

// scaleChild is the child side of the scale benchmark.
func scaleChild(role string) {
	bufio.NewReader(os.Stdin).ReadString('\n')
	socket := os.Getenv("SLOTBENCH_SOCKET")
	atoi := func(k string) int { n, _ := strconv.Atoi(os.Getenv(k)); return n }
	enc := json.NewEncoder(os.Stdout)
	switch role {
	case "probe":
		enc.Encode(probe(socket, atoi("SLOTBENCH_HELLOS"), atoi("SLOTBENCH_ACQUIRES")))
	case "flood":
		var lim unix.Rlimit
		unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
		lim.Cur = lim.Max
		unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
		var conns []net.Conn
		var hdr [slotv1.HeaderLen]byte
		binary.BigEndian.PutUint32(hdr[:], 64<<10) // a 64 KiB frame that never comes
		for len(conns) < atoi("SLOTBENCH_FLOOD") {
			c, err := net.Dial("unix", socket)
			if err != nil {
				break // refused or out of fds: hold what we have
			}
			c.Write(hdr[:])
			conns = append(conns, c)
		}
		enc.Encode(map[string]int{"held": len(conns)})
		stall()
	case "stall":
		// A process that keeps its container served.
		enc.Encode(map[string]int{})
		stall()
	case "pin", "churn", "flap", "release", "lease":
		floodChild(role, socket, atoi("SLOTBENCH_FLOOD"), func(v any) { enc.Encode(v) })
	case "idle":
		// Idle connections without HELLO; each one closed is reopened.
		n := atoi("SLOTBENCH_FLOOD")
		for i := 0; i < n; i++ {
			go func() {
				for {
					c, err := net.Dial("unix", socket)
					if err == nil {
						c.Read(make([]byte, 1)) // returns when the agent closes it
						c.Close()
					}
					time.Sleep(time.Millisecond)
				}
			}()
		}
		enc.Encode(map[string]int{"held": n})
		stall()
	}
}

// stall waits until the process is killed.
func stall() {
	// Not select{}: with no goroutine left to wake it, the runtime would
	// end the process, and the connections.
	for {
		time.Sleep(time.Hour)
	}
}

func probe(socket string, hellos, acquires int) probeResult {
	var r probeResult
	hello := frameBytes(&slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: slotv1.HelloFDPassing})
	buf := make([]byte, 4096)
	for i := 0; i < hellos; i++ {
		t0 := time.Now()
		c, err := net.Dial("unix", socket)
		if err != nil {
			r.Refused++ // the backlog full (EAGAIN)
			continue
		}
		c.Write(hello)
		if _, err := io.ReadAtLeast(c, buf, 4); err != nil {
			r.Refused++ // closed at accept
			c.Close()
			continue
		}
		r.Hello = append(r.Hello, int64(time.Since(t0)))
		c.Close()
	}
	c, err := client.Dial(socket, client.Options{Name: "probe", Wait: time.Second})
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer c.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for i := 0; i < acquires; i++ {
		t0 := time.Now()
		l, err := c.Acquire(250, "probe", "")
		if err != nil {
			r.Err = err.Error()
			return r
		}
		r.Acquire = append(r.Acquire, int64(time.Since(t0)))
		if _, err := l.Release(slotv1.InvocationOK); err != nil {
			r.Err = err.Error()
			return r
		}
	}
	return r
}

func frameBytes(m slotv1.Message) []byte {
	b, err := slotv1.Append(nil, 1, m)
	if err != nil {
		panic(err)
	}
	return b
}
