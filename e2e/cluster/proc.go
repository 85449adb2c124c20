package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a child process of the harness. Its pidfile (in the run dir)
// lets the next Up stop it if this test process dies without Down.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error // after done
}

type pidRecord struct {
	Name  string   `json:"name"`
	PID   int      `json:"pid"`
	Start uint64   `json:"start"` // /proc/<pid>/stat starttime: tells PID reuse apart
	Argv  []string `json:"argv"`
}

// procStart returns the start time of a process (clock ticks after boot),
// 0 if it does not exist.
func procStart(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) may contain spaces; fields after ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	// starttime is field 22; f[0] is field 3.
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

func (c *Cluster) start(name string, argv []string, env []string) (*proc, error) {
	logPath := filepath.Join(c.logDir, name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = c.runDir
	// Own process group: a Ctrl-C on the terminal reaches the test, which
	// tears down in order, not every component at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	rec := pidRecord{Name: name, PID: cmd.Process.Pid, Start: procStart(cmd.Process.Pid), Argv: argv}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(c.runDir, "pids", name+".json"), b, 0o600); err != nil {
		c.logf("cluster: pidfile for %s: %v", name, err)
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	c.logf("cluster: started %s (pid %d), log %s", name, rec.PID, logPath)
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILL.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.cmd.Process.Kill()
	<-p.done
}

// tail returns the last n lines of the process's log.
func (p *proc) tail(n int) string {
	return TailFile(p.logPath, n)
}

// TailFile returns the last n lines of the file at path, reading at most
// its last 64 KiB: a diagnosis that runs every minute of a slow wait costs
// the same however long the log has grown.
func TailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const most = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > most {
		f.Seek(st.Size()-most, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (c *Cluster) proc(name string) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

// stopStale stops the processes a previous run recorded in its pidfiles,
// if they are still the same processes (PID and start time), and any
// process whose command line names the run dir (containerd's shims, which
// outlive containerd and are not its children once it has gone).
func stopStale(runDir string, logf func(string, ...any)) {
	files, _ := filepath.Glob(filepath.Join(runDir, "pids", "*.json"))
	var pids []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var r pidRecord
		if json.Unmarshal(b, &r) != nil || r.PID <= 1 {
			continue
		}
		if st := procStart(r.PID); st != 0 && st == r.Start {
			logf("cluster: stopping stale %s (pid %d) of a previous run", r.Name, r.PID)
			pids = append(pids, r.PID)
		}
	}
	pids = append(pids, pidsMentioning(runDir+"/")...)
	killAll(pids, 5*time.Second)
}

// pidsMentioning lists processes (but this one) with s in their command
// line.
func pidsMentioning(s string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if bytes.Contains(b, []byte(s)) {
			out = append(out, pid)
		}
	}
	return out
}

// killAll sends SIGTERM, waits up to grace for the processes to go, then
// SIGKILLs the rest.
func killAll(pids []int, grace time.Duration) {
	if len(pids) == 0 {
		return
	}
	starts := map[int]uint64{}
	for _, pid := range pids {
		starts[pid] = procStart(pid)
		syscall.Kill(pid, syscall.SIGTERM)
	}
	alive := func() []int {
		var a []int
		for _, pid := range pids {
			if st := procStart(pid); st != 0 && st == starts[pid] && !zombie(pid) {
				a = append(a, pid)
			}
		}
		return a
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if len(alive()) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, pid := range alive() {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for i := 0; i < 100 && len(alive()) > 0; i++ {
		time.Sleep(50 * time.Millisecond)
	}
}

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// run runs a short command and returns its combined output.
func run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return string(out), fmt.Errorf("%s: %w", name, err)
	}
	return string(out), nil
}
