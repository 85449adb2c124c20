package agent_test

// Test harness: a real agent on the real kernel's cgroups, and child
// processes (this test binary re-executed) that act as runtimes or as a
// separate agent process.

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

func TestMain(m *testing.M) {
	if s := os.Getenv("CPUSLOT_CHILD"); s != "" {
		os.Exit(runChild(s))
	}
	os.Exit(m.Run())
}

type env struct {
	t      testing.TB
	h      *cgroup.Hierarchy
	rel    string // the container's cgroup
	dir    string // temp dir holding the socket
	socket string
	cfg    agent.Config
	a      *agent.Agent
	stop   func()
	// sources run beside the configured containers' static source.
	sources []discover.Source
	// logs, when set, gets the agent's log from info level up.
	logs *logBuffer
}

// logBuffer collects an agent's log lines for a test to search.
type logBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newEnv makes a container cgroup (with a CPU limit when limitMilli > 0)
// and a config whose socket lives in a world-accessible temp dir.
func newEnv(t testing.TB, limitMilli uint32, mutate func(*agent.Config)) *env {
	h := cgrouptest.Kernel(t)
	e := &env{t: t, h: h, rel: cgrouptest.NewContainer(t, h, limitMilli)}
	e.dir = worldDir(t)
	e.socket = filepath.Join(e.dir, "agent.sock")
	e.cfg = agent.DefaultConfig()
	e.cfg.Socket = e.socket
	e.cfg.HTTP = ""
	e.cfg.Pool.Prewarm = "250m=2,500m=1"
	e.cfg.ReapInterval = agent.Duration{Duration: time.Hour}
	e.cfg.Standalone.Containers = []string{e.rel}
	if mutate != nil {
		mutate(&e.cfg)
	}
	t.Cleanup(func() {
		if left := cgrouptest.Leftovers(h, e.rel); len(left) != 0 {
			t.Errorf("slot directories leaked: %v", left)
		}
	})
	return e
}

// serveUnder has the agent serve whatever connects from below the
// container's parent cgroup (standalone.serveUnder) instead of the
// container alone.
func (e *env) serveUnder() {
	e.cfg.Standalone.Containers = nil
	e.cfg.Standalone.ServeUnder = []string{filepath.Dir(e.rel)}
}

// sibling makes cgroup name beside the container, in every hierarchy, and
// returns its path.
func (e *env) sibling(name string) string {
	rel := filepath.Join(filepath.Dir(e.rel), name)
	for _, root := range cgroupRoots(e.h) {
		if err := os.MkdirAll(filepath.Join(root, rel), 0o755); err != nil {
			e.t.Fatal(err)
		}
	}
	return rel
}

// worldDir is a temp dir that an unprivileged child can reach.
func worldDir(t testing.TB) string {
	d := t.TempDir()
	for p := d; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o755)
	}
	return d
}

// start runs the agent in this process until the test ends; at the end the
// agent removes its slots, as an uninstall does.
func (e *env) start() *agent.Agent {
	log := slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if e.logs != nil {
		log = slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{e.t}, e.logs), &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	a, err := agent.New(e.cfg, log)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- a.Run(ctx, append([]discover.Source{discover.Static{Hierarchy: e.h, Cgroups: e.cfg.Standalone.Containers}}, e.sources...), true)
	}()
	e.a = a
	e.stop = func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("agent: %v", err)
		}
	}
	e.t.Cleanup(func() {
		if e.stop != nil {
			e.stop()
		}
	})
	waitFor(e.t, "agent ready", a.Ready)
	return a
}

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

// waitFor polls ok until it holds. The bound only keeps a broken test from
// hanging: it is generous, because a loaded or emulated machine is slow.
func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// childOpts say where and as whom a child runs.
type childOpts struct {
	// cgroup is where the child starts ("" = the hierarchy root).
	cgroup string
	// unprivileged runs the child as nobody in a new cgroup namespace.
	unprivileged bool
	// newPIDNS starts the child in a PID namespace of its own, as in a pod.
	newPIDNS bool
	env      []string
}

type child struct {
	cmd   *exec.Cmd
	out   *bufio.Reader
	stdin io.Writer
}

// spawn starts this test binary as child scenario name. The child waits on
// stdin until it has been placed in its cgroup.
func spawn(t testing.TB, h *cgroup.Hierarchy, name string, o childOpts) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if o.unprivileged {
		// nobody must be able to execute the binary.
		dir := worldDir(t)
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
	cmd.Env = append(append(os.Environ(), "CPUSLOT_CHILD="+name), o.env...)
	cmd.Stderr = testWriter{t}
	if o.unprivileged {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: 65534, Gid: 65534},
			Cloneflags: syscall.CLONE_NEWCGROUP,
		}
	}
	if o.newPIDNS {
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
	if err := h.StartIn(cmd, o.cgroup); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	return &child{cmd: cmd, out: bufio.NewReader(stdout), stdin: stdin}
}

// result reads the child's JSON report (its last stdout line).
func (c *child) result(t testing.TB, v any) {
	t.Helper()
	line, err := c.out.ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v (exit: %v)", err, c.cmd.Wait())
	}
	if err := json.Unmarshal([]byte(line), v); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
}

// runChild is the child side; it reports one JSON line on stdout.
func runChild(name string) int {
	// Placed in its cgroup. Read byte by byte: a buffered reader would
	// swallow what the test writes next (a relay's first input) when the
	// test is faster than this child, and the child would wait for ever.
	for b := make([]byte, 1); ; {
		if n, err := os.Stdin.Read(b); err != nil || n == 1 && b[0] == '\n' {
			break
		}
	}
	var res any
	var err error
	switch name {
	case "acquire":
		res, err = childAcquire()
	case "hold":
		res, err = childHold()
	case "agent":
		err = childAgent()
	case "raw":
		res, err = childRaw()
	case "relay":
		res, err = childRelay()
	case "pass":
		res, err = childPass()
	case "live":
		res, err = childLive()
	case "nested":
		res, err = childNested()
	case "idle":
		res, err = childIdle()
	case "handfds":
		res, err = childHandFDs()

	default:
		err = fmt.Errorf("unknown child %q", name)
	}
	if err != nil {
		res = map[string]string{"error": err.Error()}
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	return 0
}
