// Package agenttest runs a real agent on the real kernel's cgroups for
// tests, with a fixed (static) discovery, and speaks to it as a peer: raw
// frames, the Go client, or child processes (the test binary re-executed)
// that act as runtimes or as a separate agent process. Tests of the agent
// (internal/agent) and of the slot protocol's server (internal/server)
// use it; it needs root and real cgroups.
package agenttest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"github.com/cpuslot/cpuslot/internal/discover"
)

// Env is an agent under test: its container, its socket and its config,
// and once started the agent.
type Env struct {
	T      testing.TB
	H      *cgroup.Hierarchy
	Rel    string // the container's cgroup
	Dir    string // temp dir holding the socket
	Socket string
	Cfg    agent.Config
	A      *agent.Agent
	// Stop stops the started agent.
	Stop func()
	// Sources run beside the configured containers' static source.
	Sources []discover.Source
	// Logs, when set, gets the agent's log from info level up.
	Logs *LogBuffer
}

// LogBuffer collects an agent's log lines for a test to search.
type LogBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// NewEnv makes a container cgroup (with a CPU limit when limitMilli > 0)
// and a config whose socket lives in a world-accessible temp dir.
func NewEnv(t testing.TB, limitMilli uint32, mutate func(*agent.Config)) *Env {
	h := cgrouptest.Kernel(t)
	e := &Env{T: t, H: h, Rel: cgrouptest.NewContainer(t, h, limitMilli)}
	e.Dir = WorldDir(t)
	e.Socket = filepath.Join(e.Dir, "agent.sock")
	e.Cfg = agent.DefaultConfig()
	e.Cfg.Socket = e.Socket
	e.Cfg.HTTP = ""
	e.Cfg.Pool.Prewarm = "250m=2,500m=1"
	e.Cfg.ReapInterval = agent.Duration{Duration: time.Hour}
	e.Cfg.Standalone.Containers = []string{e.Rel}
	if mutate != nil {
		mutate(&e.Cfg)
	}
	t.Cleanup(func() {
		if left := cgrouptest.Leftovers(h, e.Rel); len(left) != 0 {
			t.Errorf("slot directories leaked: %v", left)
		}
	})
	return e
}

// ServeUnder has the agent serve whatever connects from below the
// container's parent cgroup (standalone.serveUnder) instead of the
// container alone.
func (e *Env) ServeUnder() {
	e.Cfg.Standalone.Containers = nil
	e.Cfg.Standalone.ServeUnder = []string{filepath.Dir(e.Rel)}
}

// Sibling makes cgroup name beside the container, in every hierarchy, and
// returns its path.
func (e *Env) Sibling(name string) string {
	rel := filepath.Join(filepath.Dir(e.Rel), name)
	for _, root := range CgroupRoots(e.H) {
		if err := os.MkdirAll(filepath.Join(root, rel), 0o755); err != nil {
			e.T.Fatal(err)
		}
	}
	return rel
}

// WorldDir is a temp dir that an unprivileged child can reach.
func WorldDir(t testing.TB) string {
	d := t.TempDir()
	for p := d; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o755)
	}
	return d
}

// Start runs the agent in this process until the test ends; at the end the
// agent removes its slots, as an uninstall does.
func (e *Env) Start() *agent.Agent {
	log := slog.New(slog.NewTextHandler(testWriter{e.T}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if e.Logs != nil {
		log = slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{e.T}, e.Logs), &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	a, err := agent.New(e.Cfg, log)
	if err != nil {
		e.T.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- a.Run(ctx, append([]discover.Source{discover.Static{Hierarchy: e.H, Cgroups: e.Cfg.Standalone.Containers}}, e.Sources...), true)
	}()
	e.A = a
	e.Stop = func() {
		cancel()
		if err := <-done; err != nil {
			e.T.Errorf("agent: %v", err)
		}
	}
	e.T.Cleanup(func() {
		if e.Stop != nil {
			e.Stop()
		}
	})
	WaitFor(e.T, "agent ready", a.Ready)
	return a
}

// TestLog is a writer that logs each line to t (errors only, for a fuzz
// target).
func TestLog(t testing.TB) io.Writer { return testWriter{t} }

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	if _, fuzz := w.t.(*testing.F); fuzz {
		// A fuzz target may not log through F; only errors are shown.
		if strings.Contains(string(p), "level=ERROR") {
			os.Stderr.Write(p)
		}
		return len(p), nil
	}
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// WaitFor polls ok until it holds. The bound only keeps a broken test from
// hanging: it is generous, because a loaded or emulated machine is slow.
func WaitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// ChildOpts say where and as whom a child runs.
type ChildOpts struct {
	// Cgroup is where the child starts ("" = the hierarchy root).
	Cgroup string
	// Unprivileged runs the child as nobody in a new cgroup namespace.
	Unprivileged bool
	// NewPIDNS starts the child in a PID namespace of its own, as in a pod.
	NewPIDNS bool
	Env      []string
}

// Child is a child process started by Spawn.
type Child struct {
	Cmd   *exec.Cmd
	Out   *bufio.Reader
	Stdin io.Writer
}

// Spawn starts this test binary as child scenario name. The child waits on
// stdin until it has been placed in its cgroup.
func Spawn(t testing.TB, h *cgroup.Hierarchy, name string, o ChildOpts) *Child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if o.Unprivileged {
		// nobody must be able to execute the binary.
		dir := WorldDir(t)
		cp := filepath.Join(dir, "child")
		b, err := os.ReadFile(exe)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cp, b, 0o755); err != nil {
			t.Fatal(err)
		}
		exe = cp
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "CPUSLOT_CHILD="+name), o.Env...)
	cmd.Stderr = TestLog(t)
	if o.Unprivileged {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: 65534, Gid: 65534},
			Cloneflags: syscall.CLONE_NEWCGROUP,
		}
	}
	if o.NewPIDNS {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWPID
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.StartIn(cmd, o.Cgroup); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	return &Child{Cmd: cmd, Out: bufio.NewReader(stdout), Stdin: stdin}
}

// Result reads the child's JSON report (its last stdout line).
func (c *Child) Result(t testing.TB, v any) {
	t.Helper()
	line, err := c.Out.ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v (exit: %v)", err, c.Cmd.Wait())
	}
	if err := json.Unmarshal([]byte(line), v); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
}

// StartAgentChild runs an agent in a child process (its socket and
// container in env, as childAgent reads them) and waits until it is ready.
// The socket file is no sign: bind(2) makes it before listen(2), and a
// connection in between is refused. A child that fails or dies first fails
// the test with its error and exit status.
func StartAgentChild(t testing.TB, h *cgroup.Hierarchy, env []string) *Child {
	t.Helper()
	ch := Spawn(t, h, "agent", ChildOpts{Cgroup: "/", Env: env})
	line := make(chan string, 1)
	go func() {
		s, _ := ch.Out.ReadString('\n')
		line <- s
	}()
	var s string
	select {
	case s = <-line:
	case <-time.After(time.Minute): // a hang bound only: emulated machines are slow
		ch.Cmd.Process.Kill()
		t.Fatalf("agent child not ready within a minute")
	}
	var r struct {
		Ready bool   `json:"ready"`
		Error string `json:"error"`
	}
	if json.Unmarshal([]byte(s), &r) != nil || !r.Ready {
		why := r.Error
		if why == "" {
			why = fmt.Sprintf("it said %q", s)
		}
		t.Fatalf("agent child did not start: %s (exit: %v)", why, ch.Cmd.Wait())
	}
	return ch
}

// Children are child scenarios by name: each reports what it did as a
// JSON line on stdout (an error as {"error": ...}).
type Children map[string]func() (any, error)

// Main runs the tests of a package, or, in a child process Spawn started,
// its scenario: one of this package's (acquire, hold, agent, pass, live) or
// of children. A package's TestMain calls it.
func Main(m *testing.M, children Children) {
	if s := os.Getenv("CPUSLOT_CHILD"); s != "" {
		os.Exit(runChild(s, children))
	}
	os.Exit(m.Run())
}

// runChild is the child side; it reports one JSON line on stdout.
func runChild(name string, children Children) int {
	// Placed in its cgroup. Read byte by byte: a buffered reader would
	// swallow what the test writes next (a relay's first input) when the
	// test is faster than this child, and the child would wait for ever.
	for b := make([]byte, 1); ; {
		if n, err := os.Stdin.Read(b); err != nil || n == 1 && b[0] == '\n' {
			break
		}
	}
	run := children[name]
	if run == nil {
		run = ours[name]
	}
	var res any
	var err error
	if run == nil {
		err = fmt.Errorf("unknown child %q", name)
	} else {
		res, err = run()
	}
	if err != nil {
		res = map[string]string{"error": err.Error()}
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	return 0
}

// ours are this package's child scenarios.
var ours = Children{
	"acquire": childAcquire,
	"hold":    childHold,
	"agent":   func() (any, error) { return nil, childAgent() },
	"pass":    childPass,
	"live":    childLive,
}

// RunAgent runs an agent with cfg until stop is called; cleanup says
// whether it removes its slots on the way out (uninstall) or leaves them
// (restart).
func RunAgent(t *testing.T, h *cgroup.Hierarchy, cfg agent.Config, cleanup bool) (a *agent.Agent, stop func()) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(TestLog(t), &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, err := agent.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- a.Run(ctx, []discover.Source{discover.Static{Hierarchy: h, Cgroups: cfg.Standalone.Containers}}, cleanup)
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}
	t.Cleanup(stop)
	WaitFor(t, "agent ready", a.Ready)
	return a, stop
}

// CgroupRoots are the hierarchy's roots that hold the cpu controller and
// (v1) cpuacct.
func CgroupRoots(h *cgroup.Hierarchy) []string {
	if h.AcctRoot != "" {
		return []string{h.CPURoot, h.AcctRoot}
	}
	return []string{h.CPURoot}
}
