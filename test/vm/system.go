package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A System is a running guest that boots the host's own userland with
// systemd as PID 1, the way a cgroup v2 node boots: the host's root is the
// read-only lower layer of an overlay whose upper layer is a tmpfs, so the
// guest can write anywhere and the host is never changed. systemd mounts
// cgroup2 itself (nsdelegate,memory_recursiveprot).
//
// The guest boots SystemOptions.Target, a small target of the caller's; this
// package adds a control shell on the second serial port (Exec) and, with
// SystemOptions.Forward, the network. No other unit starts unless something
// pulls it in.
type System struct {
	cmd     *exec.Cmd
	tmp     string
	unlock  func()
	done    chan struct{}
	waitErr error
	start   time.Time

	consoleMu   sync.Mutex
	console     bytes.Buffer
	consoleLast time.Time // when the console's last line came
	setupFail   string

	ctlMu   sync.Mutex
	ctl     net.Conn
	ctlR    *bufio.Reader
	nonce   string
	execSeq int
	ready   bool
}

// SystemOptions describe a System boot.
type SystemOptions struct {
	// Target is the unit systemd boots (systemd.unit=), e.g.
	// "v2node.target"; Etc must define it, with AllowIsolate=yes.
	Target string
	// Etc maps paths relative to /etc to file contents, written over the
	// host's /etc in the guest (units under "systemd/system/...", configs).
	Etc map[string]string
	// Tmpfs lists guest directories that get a tmpfs of their own before
	// systemd starts: an overlayfs cannot be the upper layer of another
	// one, so e.g. containerd's overlayfs snapshotter needs one.
	Tmpfs []string
	// Forward maps TCP ports on the host's 127.0.0.1 to guest ports, over
	// qemu user networking (restricted: the guest reaches nothing outside).
	// The guest's address is GuestIP. Without forwards the guest has no
	// network interface but lo.
	Forward map[int]int
	// MemoryMB is the guest memory (default 3072); CPUs the number of
	// virtual CPUs (default 2).
	MemoryMB int
	CPUs     int
	// KernelArgs are appended to the kernel command line.
	KernelArgs []string
	// Console, if set, receives the serial console (kernel and systemd)
	// as it comes.
	Console io.Writer
}

const (
	// GuestIP is the guest's address on qemu's user network; the host is
	// GuestGateway there.
	GuestIP      = "10.0.2.15"
	GuestGateway = "10.0.2.2"
	// systemModulesDir is where hack/v2node-deps.sh keeps the modules a
	// System boot loads (9p, overlay, autofs4, virtio_net, veth).
	systemModulesDir = "node-modules"
	markerExecBegin  = "@@CPUSLOT-VM-EXEC-BEGIN:"
	markerExecEnd    = "@@CPUSLOT-VM-EXEC-END:"
	markerShellReady = "@@CPUSLOT-VM-SHELL-READY@@"
)

// SystemAvailable reports whether a System can boot here: the VM, and the
// modules hack/v2node-deps.sh keeps.
func SystemAvailable() error {
	p, err := findPaths()
	if err != nil {
		return err
	}
	_, err = systemModules(p.cache)
	return err
}

// RequireSystem is Require for tests that boot a System: it also needs the
// modules hack/v2node-deps.sh keeps.
func RequireSystem(t testing.TB) {
	t.Helper()
	Require(t)
	if err := SystemAvailable(); err != nil {
		if os.Getenv(EnvRequireVM) == "1" {
			t.Fatalf("%v (%s=1, so not skipping)", err, EnvRequireVM)
		}
		t.Skip(err)
	}
}

// StartSystem boots the guest and returns once qemu runs; WaitReady waits
// for the control shell. The caller must Stop it. Boots are serialized with
// every other VM boot (Run) for the System's whole life.
func StartSystem(ctx context.Context, opts SystemOptions) (s *System, err error) {
	if opts.Target == "" || strings.ContainsAny(opts.Target, " \n/") {
		return nil, fmt.Errorf("vm: SystemOptions.Target %q is not a unit name", opts.Target)
	}
	p, err := findPaths()
	if err != nil {
		return nil, err
	}
	mods, err := systemModules(p.cache)
	if err != nil {
		return nil, err
	}
	if opts.MemoryMB == 0 {
		opts.MemoryMB = 3072
	}
	if opts.CPUs == 0 {
		opts.CPUs = 2
	}
	nonce := make([]byte, 8)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	s = &System{nonce: hex.EncodeToString(nonce), done: make(chan struct{})}
	s.tmp, err = os.MkdirTemp("", "cpuslot-vm-system-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(s.tmp)
		}
	}()

	// The guest's /etc additions travel in the initramfs under /system/etc.
	etc := map[string]string{}
	for k, v := range opts.Etc {
		etc[k] = v
	}
	for k, v := range systemUnits(opts) {
		if _, dup := etc[k]; dup {
			return nil, fmt.Errorf("vm: SystemOptions.Etc[%q] is this package's", k)
		}
		etc[k] = v
	}
	files := map[string]string{}
	names := make([]string, 0, len(etc))
	for k := range etc {
		names = append(names, k)
	}
	sort.Strings(names)
	for i, k := range names {
		if c := path.Clean(k); c != k || path.IsAbs(k) || strings.HasPrefix(k, "../") || k == ".." {
			return nil, fmt.Errorf("vm: SystemOptions.Etc[%q] is not a clean relative path", k)
		}
		host := filepath.Join(s.tmp, "etc-"+strconv.Itoa(i))
		if err := os.WriteFile(host, []byte(etc[k]), 0o644); err != nil {
			return nil, err
		}
		files["/system/etc/"+k] = host
	}
	var guestMods []string
	for _, m := range mods {
		g := guestModuleDir + "/" + filepath.Base(m)
		files[g] = m
		guestMods = append(guestMods, g)
	}
	for _, d := range opts.Tmpfs {
		if _, err := cleanGuestPath(d); err != nil || d == "/" {
			return nil, fmt.Errorf("vm: SystemOptions.Tmpfs: %q: %v", d, err)
		}
	}
	initrd := filepath.Join(s.tmp, "initrd.gz")
	if err := writeInitramfs(initrd, p.busybox, systemInitScript(s.nonce, guestMods, opts.Tmpfs), files, nil); err != nil {
		return nil, err
	}

	s.unlock, err = lockBoot(ctx, filepath.Join(p.cache, "qemu.lock"))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.unlock()
		}
	}()

	ctlSock := filepath.Join(s.tmp, "ctl.sock")
	cmdline := append([]string{
		"console=ttyS0", "panic=-1",
		"systemd.unified_cgroup_hierarchy=1",
		"systemd.unit=" + opts.Target,
		"systemd.show_status=1",
		"systemd.log_color=0",
	}, opts.KernelArgs...)
	args := []string{
		"-m", strconv.Itoa(opts.MemoryMB),
		"-smp", strconv.Itoa(opts.CPUs),
		"-display", "none", "-monitor", "none", "-no-reboot",
		"-serial", "stdio",
		"-serial", "unix:" + ctlSock + ",server=on,wait=off",
		"-kernel", p.kernel,
		"-initrd", initrd,
		"-append", strings.Join(cmdline, " "),
		// The host's root, read-only (qemu opens files as the test's user).
		"-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
	}
	if len(opts.Forward) == 0 {
		args = append(args, "-nic", "none")
	} else {
		nic := "user,model=virtio-net-pci,restrict=on"
		hosts := make([]int, 0, len(opts.Forward))
		for h := range opts.Forward {
			hosts = append(hosts, h)
		}
		sort.Ints(hosts)
		for _, h := range hosts {
			nic += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", h, opts.Forward[h])
		}
		args = append(args, "-nic", nic)
	}
	s.cmd = exec.Command(p.qemu, args...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	s.cmd.Stderr = &stderr
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	s.start = time.Now()
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting qemu: %w", err)
	}
	consoleDone := make(chan struct{})
	go func() {
		defer close(consoleDone)
		s.readConsole(stdout, opts.Console)
	}()
	go func() {
		<-consoleDone
		err := s.cmd.Wait()
		if err != nil && stderr.Len() > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
		}
		s.waitErr = err
		close(s.done)
	}()
	// qemu creates the control socket before the guest runs.
	for {
		c, err := net.Dial("unix", ctlSock)
		if err == nil {
			s.ctl, s.ctlR = c, bufio.NewReaderSize(c, 64<<10)
			break
		}
		select {
		case <-s.done:
			s.unlock()
			return nil, fmt.Errorf("vm: qemu exited before its control socket was up: %v", s.waitErr)
		case <-ctx.Done():
			s.kill()
			return nil, fmt.Errorf("vm: connecting to qemu's control socket: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return s, nil
}

func (s *System) readConsole(r io.Reader, stream io.Writer) {
	br := bufio.NewReaderSize(r, 64<<10)
	fail := markerFail + s.nonce + " "
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			s.consoleMu.Lock()
			s.console.WriteString(line)
			s.consoleLast = time.Now()
			if i := strings.Index(line, fail); i >= 0 && s.setupFail == "" {
				s.setupFail = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(line[i+len(fail):]), "@@"))
			}
			s.consoleMu.Unlock()
			if stream != nil {
				io.WriteString(stream, line)
			}
		}
		if err != nil {
			return
		}
	}
}

// ConsoleTail returns the last n lines of the serial console.
func (s *System) ConsoleTail(n int) string {
	s.consoleMu.Lock()
	defer s.consoleMu.Unlock()
	return tail(s.console.String(), n)
}

// Uptime is the time since qemu started.
func (s *System) Uptime() time.Duration { return time.Since(s.start) }

// Done is closed when qemu has exited.
func (s *System) Done() <-chan struct{} { return s.done }

// WaitReady waits until the control shell answers: systemd is up and has
// started the shell unit. The error says why it is not (setup failure, qemu
// exit, ctx) with the console's tail.
func (s *System) WaitReady(ctx context.Context) error {
	s.ctlMu.Lock()
	defer s.ctlMu.Unlock()
	if s.ready {
		return nil
	}
	stop := context.AfterFunc(ctx, func() { s.ctl.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	for {
		line, err := s.ctlR.ReadString('\n')
		if strings.Contains(line, markerShellReady) {
			s.ready = true
			s.ctl.SetReadDeadline(time.Time{})
			return nil
		}
		if err != nil {
			return s.why("waiting for the guest's control shell", ctx, err)
		}
	}
}

// why explains a failed wait: setup failure, qemu gone, or ctx.
func (s *System) why(what string, ctx context.Context, err error) error {
	s.consoleMu.Lock()
	fail := s.setupFail
	s.consoleMu.Unlock()
	select {
	case <-s.done:
		err = fmt.Errorf("qemu exited after %v (%v)", s.Uptime().Round(time.Second), s.waitErr)
	default:
		if ctx.Err() != nil {
			err = fmt.Errorf("%w after %v; %s", ctx.Err(), s.Uptime().Round(time.Second), s.hostView())
		}
	}
	if fail != "" {
		err = fmt.Errorf("guest setup failed: %s (%v)", fail, err)
	}
	return fmt.Errorf("vm: %s: %w; console tail:\n%s", what, err, s.ConsoleTail(40))
}

// hostView says what the host sees of a guest that does not answer: whether
// qemu still uses CPU (a busy or a frozen guest) and how long the console
// has been silent. It takes 5 s.
func (s *System) hostView() string {
	s.consoleMu.Lock()
	silent := time.Since(s.consoleLast).Round(time.Second)
	s.consoleMu.Unlock()
	pid := s.cmd.Process.Pid
	before, err1 := cpuTicks(pid)
	time.Sleep(5 * time.Second)
	after, err2 := cpuTicks(pid)
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Sprintf("qemu's CPU time unknown (%v); console silent for %v", err, silent)
	}
	// Ticks are 1/100 s (USER_HZ) on every Linux architecture Go supports,
	// so ticks over 5 s divided by 5 is a percentage of one CPU.
	return fmt.Sprintf("qemu used %d%% of a CPU over 5 s (0: the guest is frozen); console silent for %v",
		(after-before)/5, silent)
}

// cpuTicks is a process's user+system CPU time in clock ticks (proc(5)).
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command, which is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	return u + st, errors.Join(err1, err2)
}

// Exec runs script with bash as root in the guest (stdin /dev/null) and
// returns its output (stdout and stderr interleaved) and exit code. An error
// means it did not run to its end: the shell is not ready, qemu exited, or
// ctx expired (the script may still be running in the guest then; a later
// Exec skips its output).
func (s *System) Exec(ctx context.Context, script string) (string, int, error) {
	if err := s.WaitReady(ctx); err != nil {
		return "", -1, err
	}
	s.ctlMu.Lock()
	defer s.ctlMu.Unlock()
	s.execSeq++
	id := s.nonce + "-" + strconv.Itoa(s.execSeq)
	stop := context.AfterFunc(ctx, func() { s.ctl.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	defer s.ctl.SetReadDeadline(time.Time{})
	if _, err := fmt.Fprintf(s.ctl, "%s %s\n", id, base64.StdEncoding.EncodeToString([]byte(script))); err != nil {
		return "", -1, s.why("sending a command to the guest", ctx, err)
	}
	begin, end := markerExecBegin+id+"@@", markerExecEnd+id+" rc="
	var out strings.Builder
	begun := false
	for {
		line, err := s.ctlR.ReadString('\n')
		if !begun {
			// Output of an earlier command that timed out, if any.
			begun = strings.Contains(line, begin)
		} else if i := strings.Index(line, end); i >= 0 {
			out.WriteString(line[:i])
			rest := strings.TrimSpace(line[i+len(end):])
			code, cerr := strconv.Atoi(strings.TrimSuffix(rest, "@@"))
			if cerr != nil {
				return out.String(), -1, fmt.Errorf("vm: garbled end marker %q", line)
			}
			return out.String(), code, nil
		} else {
			out.WriteString(line)
		}
		if err != nil {
			return out.String(), -1, s.why("running a command in the guest", ctx, err)
		}
	}
}

// Stop kills qemu (the guest's state is a tmpfs: nothing to save) and
// waits for it; it is safe to call more than once.
func (s *System) Stop() error {
	s.kill()
	return nil
}

func (s *System) kill() {
	select {
	case <-s.done:
	default:
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			s.cmd.Process.Kill()
			<-s.done
		}
	}
	if s.ctl != nil {
		s.ctl.Close()
	}
	if s.unlock != nil {
		s.unlock()
		s.unlock = nil
	}
	os.RemoveAll(s.tmp)
}

// errBootStalled: the guest printed nothing for bootStall before its control
// shell was up.
var errBootStalled = errors.New("the guest's console was silent for too long during boot")

// bootStall is how long a boot may go without a console line. A systemd
// boot prints a line every few seconds even on a loaded emulated machine;
// once in CI the guest kernel stopped early in its boot with both vCPUs
// spinning (qemu at 192% of a CPU, the console silent for 10 minutes after
// "IP idents hash table entries"), and such a boot never recovers.
const bootStall = 3 * time.Minute

// BootSystem starts the guest and waits for its control shell, like
// StartSystem and WaitReady; a boot whose console stays silent for
// bootStall is killed and started once more (logf says so, with the stalled
// boot's console tail). The caller must Stop the System.
func BootSystem(ctx context.Context, opts SystemOptions, logf func(format string, args ...any)) (*System, error) {
	for try := 1; ; try++ {
		s, err := StartSystem(ctx, opts)
		if err != nil {
			return nil, err
		}
		wctx, cancel := context.WithCancelCause(ctx)
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Second):
				}
				s.consoleMu.Lock()
				last := s.consoleLast
				s.consoleMu.Unlock()
				if last.IsZero() {
					last = s.start
				}
				if time.Since(last) > bootStall {
					cancel(errBootStalled)
					return
				}
			}
		}()
		err = s.WaitReady(wctx)
		close(stop)
		stalled := context.Cause(wctx) == errBootStalled
		cancel(nil)
		if err == nil {
			return s, nil
		}
		s.Stop()
		if !stalled || try == 2 {
			return nil, err
		}
		logf("vm: boot %d stalled (no console line for %v); booting again: %v", try, bootStall, err)
	}
}
