package agent_test

import (
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
)

// TestAttackChurnOnSharedSocket: in standalone mode every process that can
// reach the agent's one socket shares its accept queue, so an outsider
// that connects and closes as fast as it can (reconnect churn) delays or
// refuses (EAGAIN) a served container's connects. With socketDir, the
// container has a socket of its own, in a directory that only root and the
// container (by a bind mount, as a pod's emptyDir) reach: the outsider,
// churning on the shared socket, cannot even connect to the victim's, and
// the victim is served there throughout. Before, no socket of its own was
// made.
func TestAttackChurnOnSharedSocket(t *testing.T) {
	dir := filepath.Join(agenttest.WorldDir(t), "containers")
	e := agenttest.NewEnv(t, 0, func(c *agent.Config) { c.Standalone.SocketDir = dir })
	e.ServeUnder()
	// The operator makes the container's directory before it starts.
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(dir, url.PathEscape(strings.TrimPrefix(e.Rel, "/")))
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	ownSocket := filepath.Join(own, "agent.sock")
	e.Start()
	outside := e.Sibling("outsider")
	churn := agenttest.Spawn(t, e.H, "churn", agenttest.ChildOpts{Cgroup: outside, Unprivileged: true, Env: []string{"SOCKET=" + e.Socket}})
	var started map[string]string
	churn.Result(t, &started)
	if started["error"] != "" {
		t.Fatalf("churn: %v", started)
	}
	// The container's runtime starts and waits for its socket.
	agenttest.Spawn(t, e.H, "idle", agenttest.ChildOpts{Cgroup: e.Rel})
	agenttest.WaitFor(t, "the container's own socket", func() bool {
		var st unix.Stat_t
		return unix.Lstat(ownSocket, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK
	})
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Mode&0o777 != 0o700 || st.Uid != 0 {
		t.Fatalf("socketDir: mode %#o owner %d (%v), want root's, 0700", st.Mode&0o777, st.Uid, err)
	}
	// The outsider cannot reach it.
	var out agenttest.AcquireResult
	agenttest.Spawn(t, e.H, "acquire", agenttest.ChildOpts{Cgroup: outside, Unprivileged: true, Env: []string{"SOCKET=" + ownSocket, "QUOTA=250", "N=1"}}).Result(t, &out)
	if !strings.Contains(out.Error, "permission denied") {
		t.Fatalf("outsider on the container's socket: %+v, want permission denied", out)
	}
	// The victim is served on its own socket while the churn goes on.
	var r agenttest.AcquireResult
	agenttest.Spawn(t, e.H, "acquire", agenttest.ChildOpts{Cgroup: e.Rel, Env: []string{"SOCKET=" + ownSocket, "QUOTA=250", "N=20"}}).Result(t, &r)
	if r.Error != "" || r.InSlot != 20 {
		t.Fatalf("victim on its own socket: %+v", r)
	}
	var done map[string]int
	io.WriteString(churn.Stdin, "stop\n")
	churn.Result(t, &done)
	if done["connects"] == 0 {
		t.Fatalf("the outsider's churn made no connection: %v", done)
	}
	t.Logf("outsider's connects on the shared socket meanwhile: %d (%d refused)", done["connects"], done["refused"])
}

// childIdle is a container's process that waits until it is killed.
func childIdle() (any, error) {
	// Not select{}: with nothing left to wake it, the Go runtime would
	// end the process as deadlocked.
	for {
		time.Sleep(time.Hour)
	}
}

// childChurn connects to $SOCKET and closes again as fast as it can
// (non-blocking, as a flood does) until a line arrives on stdin; it says
// when it starts, and at the end how many connects went through and how
// many were refused.
func childChurn() (any, error) {
	stop := make(chan struct{})
	go func() {
		b := make([]byte, 1)
		for {
			if n, err := os.Stdin.Read(b); err != nil || n == 1 && b[0] == '\n' {
				close(stop)
				return
			}
		}
	}()
	os.Stdout.WriteString("{}\n")
	addr := &unix.SockaddrUnix{Name: os.Getenv("SOCKET")}
	n := map[string]int{}
	for {
		select {
		case <-stop:
			return n, nil
		default:
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		if unix.Connect(fd, addr) == nil {
			n["connects"]++
		} else {
			n["refused"]++
		}
		unix.Close(fd)
	}
}

// TestOwnSocketOnFirstContact: a container below serveUnder that first
// connects on the shared socket gets its own socket too when its directory
// is there, and the socket (not the operator's directory) goes when the
// container is torn down.
func TestOwnSocketOnFirstContact(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "containers")
	e := agenttest.NewEnv(t, 0, func(c *agent.Config) { c.Standalone.SocketDir = dir })
	e.ServeUnder()
	a := e.Start()
	own := filepath.Join(dir, url.PathEscape(strings.TrimPrefix(e.Rel, "/")))
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	ch := agenttest.Spawn(t, e.H, "acquire", agenttest.ChildOpts{Cgroup: e.Rel, Env: []string{"SOCKET=" + e.Socket, "QUOTA=250", "N=1"}})
	var r agenttest.AcquireResult
	ch.Result(t, &r)
	if r.Error != "" {
		t.Fatalf("on the shared socket: %+v", r)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(own, "agent.sock"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		t.Fatalf("no socket of its own after its first contact: %v", err)
	}
	ch.Cmd.Wait()
	a.Maintain(time.Now())
	if err := unix.Lstat(filepath.Join(own, "agent.sock"), &st); err == nil {
		t.Fatal("the socket outlived its container's teardown")
	}
	if _, err := os.Stat(own); err != nil {
		t.Fatalf("the operator's directory went: %v", err)
	}
}

// TestOwnSocketsOnly: with no shared socket (socket "" in the file),
// containers below serveUnder are served by their directories alone, and
// no local user has a socket of the agent to churn on.
func TestOwnSocketsOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "containers")
	e := agenttest.NewEnv(t, 0, func(c *agent.Config) { c.Standalone.SocketDir = dir; c.Socket = "" })
	e.ServeUnder()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, url.PathEscape(strings.TrimPrefix(e.Rel, "/"))), 0o755); err != nil {
		t.Fatal(err)
	}
	ownSocket := filepath.Join(dir, url.PathEscape(strings.TrimPrefix(e.Rel, "/")), "agent.sock")
	e.Start()
	agenttest.Spawn(t, e.H, "idle", agenttest.ChildOpts{Cgroup: e.Rel})
	agenttest.WaitFor(t, "the container's own socket", func() bool {
		var st unix.Stat_t
		return unix.Lstat(ownSocket, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK
	})
	var r agenttest.AcquireResult
	agenttest.Spawn(t, e.H, "acquire", agenttest.ChildOpts{Cgroup: e.Rel, Env: []string{"SOCKET=" + ownSocket, "QUOTA=250", "N=3"}}).Result(t, &r)
	if r.Error != "" || r.InSlot != 3 {
		t.Fatalf("on its own socket: %+v", r)
	}
	if _, err := os.Stat(e.Socket); err == nil {
		t.Fatalf("a shared socket at %s", e.Socket)
	}
}
