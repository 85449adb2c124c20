package main

// The flood benchmark: what a victim container sees while tenants flood
// the agent (docs/security.md, "Limits"). One agent serves whatever
// connects from below the run's cgroup (serveUnder); the victim's connect +
// HELLO and ACQUIRE latencies are measured quiet and under each flood:
//
//   - pin: new containers, each its own user, open connections before
//     their first HELLO, then say HELLO on each and keep them (the victim
//     is a new container too: one served at its first HELLO on the shared
//     socket, and one with a socket of its own, served before it connects);
//   - churn: users in one cgroup outside every served container connect
//     and close again as fast as they can on the agent's socket; the
//     victim is probed there and on its own socket (standalone.socketDir),
//     which the churning users cannot reach;
//   - flap: processes of a container with lending on flap a sleeping
//     lease between SLEEP and WAKE (each answered), with a borrower beside it;
//   - release: processes of a container send one-way RELEASEs of leases
//     they do not hold as fast as they can;
//   - lease (-leasers, none by default): processes of a container under a
//     CPU limit loop ACQUIRE and RELEASE with the agent placing their
//     threads: granted work, which no pace holds.
//
//	slotbench -floods
//	slotbench -floods -churn-users 0 -flappers 0 -releasers 0   # the pinning flood alone
//	slotbench -floods -pin-containers 0 -flappers 0 -releasers 0 -churn-cpu 500   # churn alone, the churners under a CPU limit
//	slotbench -floods -pin-containers 0 -flappers 0 -releasers 0 -churn-cpu 500 -churn-root   # the same, the churners root
//	slotbench -floods -pin-containers 0 -flappers 0 -releasers 0 -churn-cpu 500 -churn-unserved   # the control: the churn costs the agent nothing
//	slotbench -floods -pin-containers 0 -churn-users 0 -flappers 0 -releasers 0 -again 5   # no flood: the p99 ratios of the machine alone

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
	"github.com/cpuslot/cpuslot/internal/agent"
)

type floodParams struct {
	hellos, acquires        int
	pinContainers, pinConns int
	churnUsers, churnConns  int
	churnCPU                int  // millicores of the churning users' cgroup; 0: no limit
	churnRoot               bool // the churners are root (a container without a user namespace)
	churnUnserved           bool // the churners connect to a socket no one accepts on (the control)
	flappers, releasers     int
	leasers                 int // processes looping agent-placed ACQUIRE and RELEASE (work the agent does, paced by limits.placementRate)
	// again measures the victim again after its quiet probe with no
	// flood, this many times: how far a p99 ratio moves on the machine
	// alone (the rows' noise floor)
	again int
	// placementRate, if set, is the agent's limits.placementRate.
	placementRate int
}

func floodBench(p floodParams) error {
	tb, err := newTestbed("floods")
	if err != nil {
		return err
	}
	defer tb.close()
	h := tb.h
	cfg := tb.config()
	cfg.Pool.Prewarm = "250m=4"
	cfg.Admission.LendRatio = 1
	if p.placementRate > 0 {
		cfg.Limits.PlacementRate = p.placementRate
	}
	cfg.Standalone.ServeUnder = []string{tb.root}
	// Victims with a socket of their own get a directory in socketDir
	// (withOwnSocket).
	cfg.Standalone.SocketDir = filepath.Join(tb.dir, "containers")
	if err := os.Mkdir(cfg.Standalone.SocketDir, 0o700); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	a, err := agent.New(cfg, log)
	if err != nil {
		return err
	}
	if err := tb.run(a); err != nil {
		return err
	}
	sp := scaleParams{hellos: p.hellos, acquires: p.acquires}
	var probeAt func(name, socket string) (*probeResult, error)
	probeIn := func(name string) (*probeResult, error) { return probeAt(name, cfg.Socket) }
	probeAt = func(name, socket string) (*probeResult, error) {
		rel, err := tb.container(name)
		if err != nil {
			return nil, err
		}
		var r probeResult
		if err := runScaleChild(h, rel, "probe", socket, sp, &r); err != nil {
			return nil, err
		}
		if r.Err != "" && r.Refused == 0 {
			return nil, fmt.Errorf("probe in %s: %s", name, r.Err)
		}
		return &r, nil // refused HELLOs: the flood kept the victim out
	}
	fmt.Printf("# slotbench -floods: %s, kernel %s, %d CPUs; the victim's connect + HELLO (n=%d) and ACQUIRE (n=%d), quiet and flooded\n\n",
		h, kernelRelease(), runtime.NumCPU(), p.hellos, p.acquires)
	fmt.Printf("| flood | what | quiet p50 | quiet p99 | flooded p50 | flooded p99 | p99 ratio | HELLOs refused (flooded) | agent CPU (flooded) |\n|---|---|---|---|---|---|---|---|---|\n")
	// agentCPU is the share of a core the agent (this process) used
	// while the flood ran, probe included; floodCPU before the probe, on
	// the flood alone.
	var agentCPU, floodCPU float64
	row := func(flood string, q, f *probeResult) {
		for _, m := range []struct {
			what string
			q, f []int64
		}{{"connect + HELLO", q.Hello, f.Hello}, {"ACQUIRE", q.Acquire, f.Acquire}} {
			sortNS(m.q)
			sortNS(m.f)
			refused, cpu := "", ""
			if m.what == "connect + HELLO" {
				refused, cpu = strconv.Itoa(f.Refused), fmt.Sprintf("%.2f of a core (flood alone %.2f)", agentCPU, floodCPU)
			}
			if len(m.f) == 0 {
				fmt.Printf("| %s | %s | %s | %s | none answered | none answered | - | %s | %s |\n", flood, m.what, usNS(pctNS(m.q, 0.5)), usNS(pctNS(m.q, 0.99)), refused, cpu)
				continue
			}
			fmt.Printf("| %s | %s | %s | %s | %s | %s | %.2f | %s | %s |\n", flood, m.what, usNS(pctNS(m.q, 0.5)), usNS(pctNS(m.q, 0.99)),
				usNS(pctNS(m.f, 0.5)), usNS(pctNS(m.f, 0.99)), float64(pctNS(m.f, 0.99))/float64(max(pctNS(m.q, 0.99), 1)), refused, cpu)
		}
	}
	var kids []*exec.Cmd
	stop := func() {
		for _, c := range kids {
			c.Process.Kill()
			c.Wait()
		}
		kids = nil
	}
	defer stop()
	start := func(cgroup, role string, uid int, env ...string) error {
		rel, err := tb.container(cgroup)
		if err != nil {
			return err
		}
		cmd := scaleChildCmd(role, cfg.Socket, sp)
		cmd.Env = append(cmd.Env, env...)
		if uid > 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
		}
		var r map[string]any
		c, err := startChildCmd(h, rel, role, cmd, &r)
		if err != nil {
			return err
		}
		kids = append(kids, c)
		return nil
	}
	var cpu0 time.Duration
	var wall0 time.Time
	settle := func() {
		cpu0, wall0 = cpuTime(), time.Now()
		time.Sleep(2 * time.Second)
		floodCPU = float64(cpuTime()-cpu0) / float64(time.Since(wall0))
	}
	measured := func() { agentCPU = float64(cpuTime()-cpu0) / float64(time.Since(wall0)) }
	// limitContainer sets container name's CPU limit (millicores, the
	// kubelet's 100 ms period), as a tenant's processes run under one.
	limitContainer := func(name string, milli uint32) error {
		rel, err := tb.container(name)
		if err != nil {
			return err
		}
		return setContainerLimit(h, rel, milli, 100*time.Millisecond)
	}
	// withOwnSocket gives container name a directory in socketDir (as an
	// operator would) and a process that stays, and waits until the agent
	// serves it there: its socket, on which no outsider connects.
	withOwnSocket := func(name string) (string, error) {
		rel, err := tb.container(name)
		if err != nil {
			return "", err
		}
		dir := filepath.Join(cfg.Standalone.SocketDir, url.PathEscape(strings.TrimPrefix(tb.root+"/"+name, "/")))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return "", err
		}
		var none map[string]any
		keeper, err := startChildCmd(h, rel, "stall", scaleChildCmd("stall", cfg.Socket, sp), &none)
		if err != nil {
			return "", err
		}
		kids = append(kids, keeper)
		socket := filepath.Join(dir, "agent.sock")
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			if st, err := os.Lstat(socket); err == nil && st.Mode()&os.ModeSocket != 0 {
				return socket, nil
			}
			if time.Now().After(deadline) {
				return "", fmt.Errorf("no socket of its own for %s at %s", name, socket)
			}
		}
	}

	// pin: the victim is a new container, quiet and flooded: one that
	// connects on the shared socket first, and one with a socket of its
	// own (standalone.socketDir; each pod's in Kubernetes).
	if p.pinContainers > 0 {
		quiet, err := probeIn("new-quiet")
		if err != nil {
			return err
		}
		socket, err := withOwnSocket("new-own-quiet")
		if err != nil {
			return err
		}
		quietOwn, err := probeAt("new-own-quiet", socket)
		stop()
		if err != nil {
			return err
		}
		// Spread over processes of at most maxConnectionsPerProcess
		// each, which all open their connections before any says HELLO
		// (the barrier file), so that all are charged before their
		// container is served.
		perProc := cfg.Limits.MaxConnectionsPerProcess
		barrier := filepath.Join(tb.dir, "hello")
		for i := 0; i < p.pinContainers; i++ {
			for left := p.pinConns; left > 0; left -= perProc {
				if err := start(fmt.Sprintf("pin%02d", i), "pin", outsideUID+i, fmt.Sprintf("SLOTBENCH_FLOOD=%d", min(left, perProc)),
					"SLOTBENCH_BARRIER="+barrier); err != nil {
					return err
				}
			}
		}
		if err := os.WriteFile(barrier, nil, 0o644); err != nil {
			return err
		}
		settle()
		flooded, err := probeIn("new-flooded")
		measured()
		if err != nil {
			return err
		}
		name := fmt.Sprintf("pin: %d new containers x %d connections, HELLO on each", p.pinContainers, p.pinConns)
		row(name+", victim on the shared socket", quiet, flooded)
		if socket, err = withOwnSocket("new-own-flooded"); err != nil {
			return err
		}
		settle()
		floodedOwn, err := probeAt("new-own-flooded", socket)
		measured()
		stop()
		if err != nil {
			return err
		}
		row(name+", victim on its own socket", quietOwn, floodedOwn)
	}
	if p.churnUsers+p.flappers+p.releasers+p.leasers+p.again == 0 {
		return nil
	}

	// The other floods' victim: container b, served from its first probe
	// and kept (a process of its own stays), with a socket of its own.
	ownSocket, err := withOwnSocket("b")
	if err != nil {
		return err
	}
	keeper := kids[len(kids)-1]
	kids = nil // the floods' stop leaves it
	defer func() { keeper.Process.Kill(); keeper.Wait() }()
	settle()
	fmt.Printf("| (at rest: no flood, no probe) | | | | | | | | %.2f of a core |\n", floodCPU)
	quiet, err := probeIn("b")
	if err != nil {
		return err
	}
	quietOwn, err := probeAt("b", ownSocket)
	if err != nil {
		return err
	}
	phase := func(name string, n int, begin func(i int) error) error {
		if n == 0 {
			return nil
		}
		for i := 0; i < n; i++ {
			if err := begin(i); err != nil {
				return err
			}
		}
		settle()
		flooded, err := probeIn("b")
		measured()
		if err != nil {
			stop()
			return err
		}
		row(name+", victim on the shared socket", quiet, flooded)
		if strings.HasPrefix(name, "churn") {
			settle()
			flooded, err := probeAt("b", ownSocket)
			measured()
			if err != nil {
				stop()
				return err
			}
			row(name+", victim on its own socket", quietOwn, flooded)
		}
		stop()
		return nil
	}
	for i := 0; i < p.again; i++ {
		if err := phase("none: the quiet probe again", 1, func(int) error { return nil }); err != nil {
			return err
		}
	}
	if p.churnUsers > 0 && p.churnCPU > 0 {
		// A tenant's processes run under a CPU limit: without one, the
		// churn takes every CPU from the victim's own process too, and
		// that, not the agent's socket, is what the probe would measure.
		if err := limitContainer("churn", uint32(p.churnCPU)); err != nil {
			return err
		}
	}
	who := "users"
	if p.churnRoot {
		who = "root processes"
	}
	churnName := fmt.Sprintf("churn: %d %s in one cgroup x %d connect loops", p.churnUsers, who, p.churnConns)
	if p.churnCPU > 0 {
		churnName += fmt.Sprintf(" (%dm CPU)", p.churnCPU)
	}
	churnSocket := cfg.Socket
	if p.churnUnserved {
		// The control: the same churners spend their CPU on connects to
		// a socket whose queue is full, which cost the agent nothing, so
		// what the victim sees then is the churners' CPU, not the agent's
		// work on them.
		churnSocket = filepath.Join(tb.dir, "unserved.sock")
		ln, err := net.Listen("unix", churnSocket)
		if err != nil {
			return err
		}
		defer ln.Close()
		if err := os.Chmod(churnSocket, 0o777); err != nil {
			return err
		}
		churnName += ", on a socket no one accepts on"
	}
	if err := phase(churnName, p.churnUsers, func(i int) error {
		uid := outsideUID + 100 + i
		if p.churnRoot {
			uid = 0
		}
		return start("churn", "churn", uid, fmt.Sprintf("SLOTBENCH_FLOOD=%d", p.churnConns), "SLOTBENCH_SOCKET="+churnSocket)
	}); err != nil {
		return err
	}
	if p.flappers > 0 {
		if err := limitContainer("lender", uint32(flapQuota*p.flappers)); err != nil {
			return err
		}
	}
	if err := phase(fmt.Sprintf("flap: %d processes flapping SLEEP/WAKE", p.flappers), p.flappers, func(int) error {
		return start("lender", "flap", 0)
	}); err != nil {
		return err
	}
	if err := phase(fmt.Sprintf("release: %d processes sending one-way RELEASEs", p.releasers), p.releasers, func(int) error {
		return start("releaser", "release", 0)
	}); err != nil {
		return err
	}
	if p.leasers > 0 {
		// Under a CPU limit, as a tenant's are: what the victim sees is
		// then the agent's work on the loops, not the loops' own CPU.
		if err := limitContainer("leaser", leaseLimit); err != nil {
			return err
		}
	}
	return phase(fmt.Sprintf("lease: %d processes (%dm CPU) looping ACQUIRE and RELEASE, the agent placing", p.leasers, leaseLimit), p.leasers, func(int) error {
		return start("leaser", "lease", 0)
	})
}

// leaseLimit is the CPU limit (millicores) of the leasing processes'
// container.
const leaseLimit = 500

// flapQuota is the quota of a flapper's leases: above the default
// minDegraded (50m), so a wake cuts its borrower, and small, so that the
// flappers' own CPU (each spins in its sleeper's slot) takes little of the
// victim's.
const flapQuota = 100

// floodChild is the flooding side of the flood benchmark; it reports on
// its first line and floods until killed.
func floodChild(role, socket string, n int, report func(any)) {
	hello := frameBytes(&slotv1.Hello{MinVersion: 1, MaxVersion: 1})
	switch role {
	case "pin":
		// Open n connections, then (once the barrier file exists) say
		// HELLO on each, and keep them.
		var conns []net.Conn
		for len(conns) < n {
			c, err := net.Dial("unix", socket)
			if err != nil {
				break
			}
			conns = append(conns, c)
		}
		report(map[string]int{"held": len(conns)})
		for _, err := os.Stat(os.Getenv("SLOTBENCH_BARRIER")); err != nil; _, err = os.Stat(os.Getenv("SLOTBENCH_BARRIER")) {
			time.Sleep(10 * time.Millisecond)
		}
		buf := make([]byte, 4096)
		for _, c := range conns {
			c.Write(hello)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			c.Read(buf)
		}
		stall()
	case "churn":
		for i := 0; i < n; i++ {
			go func() {
				for {
					if c, err := net.Dial("unix", socket); err == nil {
						c.Close()
					}
				}
			}()
		}
		report(map[string]int{"loops": n})
		stall()
	case "flap":
		c, err := client.Dial(socket, client.Options{Name: "flap", NoLocal: true, Wait: time.Second})
		if err != nil {
			report(map[string]string{"err": err.Error()})
			return
		}
		runtime.LockOSThread()
		sleeper, err := c.Acquire(flapQuota, "sleeper", "")
		if err == nil {
			err = sleeper.Sleep()
		}
		if err == nil {
			done := make(chan error)
			go func() {
				runtime.LockOSThread()
				_, err := c.Acquire(flapQuota, "borrower", "") // held for good
				done <- err
				stall()
			}()
			err = <-done
		}
		if err != nil {
			report(map[string]string{"err": err.Error()})
			return
		}
		report(map[string]int{"flapping": 1})
		for {
			sleeper.Wake()
			sleeper.Sleep()
		}
	case "lease":
		// Real work, granted: each ACQUIRE moves the thread into a slot
		// and its RELEASE out again (cgroup writes), as fast as answered.
		c, err := client.Dial(socket, client.Options{Name: "lease", NoLocal: true, Wait: time.Second})
		if err != nil {
			report(map[string]string{"err": err.Error()})
			return
		}
		runtime.LockOSThread()
		report(map[string]int{"leasing": 1})
		for {
			if l, err := c.Acquire(flapQuota, "lease", ""); err == nil {
				l.Release(slotv1.InvocationOK)
			}
		}
	case "release":
		c, err := net.Dial("unix", socket)
		if err == nil {
			c.Write(hello)
			_, err = c.Read(make([]byte, 4096))
		}
		if err != nil {
			report(map[string]string{"err": err.Error()})
			return
		}
		var frames []byte
		for i := 0; i < 1000; i++ {
			frames = append(frames, frameBytes(&slotv1.Release{Lease: uint64(1<<40 + i), Flags: slotv1.ReleaseNoReply})...)
		}
		report(map[string]int{"releasing": 1})
		for {
			if _, err := c.Write(frames); err != nil {
				stall()
			}
		}
	}
}
