// Package vm runs statically linked programs, typically Go test binaries,
// inside a real cgroup v2 kernel under qemu (software emulation, no KVM).
//
// The development machines bind the cpu controller to cgroup v1, so cgroup v2
// behaviour (threaded subtrees, cgroup.threads, favordynmods) can only be
// tested in a guest. The guest is a Debian kernel booted with a busybox
// initramfs; /init mounts proc, sysfs, devtmpfs, tmpfs on /tmp and /run and
// cgroup2 on /sys/fs/cgroup, enables +cpu +cpuset +pids in the root
// cgroup.subtree_control, runs one command as root and powers off.
//
// The kernel, busybox and qemu come from hack/vm-deps.sh, which keeps them
// in $CPUSLOT_VM_CACHE (default <repo>/.cache/vm).
//
// Packages with kernel tests (marked by cgrouptest.Kernel) call
// RunKernelTests from one host-side driver test, which runs every marked
// test of the package's own test binary in the guest. Other tests call
// RunGoTest with a -test.run regex; guest-only tests skip unless InGuest:
//
//	func TestV2InVM(t *testing.T) {
//		vm.RunGoTest(t, "github.com/cpuslot/cpuslot/internal/cgroup", "^TestGuestV2",
//			vm.Options{MountOptions: "favordynmods"})
//	}
//
//	func TestGuestV2Slots(t *testing.T) {
//		if !vm.InGuest() {
//			t.Skip("runs in the cgroup v2 VM, via TestV2InVM")
//		}
//		// root in a fresh VM; cgroup2 at /sys/fs/cgroup with +cpu +cpuset +pids
//	}
//
// Options.Shares mounts host directories read-only (virtio-9p); with
// Options.ShareHostLibraries the guest can run dynamically linked host
// programs such as a JDK from /usr/lib/jvm (see HostJDK).
//
// See README.md for the guest's contents and measured boot times.
package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options describe one boot.
type Options struct {
	// Command is the argv run in the guest; Command[0] is a guest path or a
	// busybox applet name.
	Command []string
	// Env is added ("KEY=value") to the command's minimal environment
	// (PATH, HOME=/root, TMPDIR=/tmp).
	Env []string
	// Files maps guest paths to host files copied into the initramfs, e.g.
	// {"/bin/cgroup.test": "/tmp/x/cgroup.test"}. Binaries must be static
	// (see BuildTestBinary).
	Files map[string]string
	// Shares maps guest mount points to host directories, exported
	// read-only over virtio-9p and mounted by /init before the command
	// runs, e.g. {"/opt/jdk": "/usr/lib/jvm/temurin-25-jdk-amd64"}. Missing
	// mount points are created (a mount point inside another share must
	// exist there). Booting with shares loads the 9p modules that
	// hack/vm-deps.sh keeps; without, nothing is loaded. See
	// ShareHostLibraries for running dynamically linked host programs.
	Shares map[string]string
	// Symlinks maps guest paths to symlink targets, created in the
	// initramfs, e.g. {"/lib": "usr/lib"}.
	Symlinks map[string]string
	// MountOptions are the cgroup2 mount options, e.g. "favordynmods".
	MountOptions string
	// Dir is the command's working directory in the guest (default "/").
	Dir string
	// KernelArgs are appended to the kernel command line.
	KernelArgs []string
	// MemoryMB is the guest memory (default 1024; a JVM wants 2048);
	// CPUs the number of virtual CPUs (default 2).
	MemoryMB int
	CPUs     int
	// Output, if set, receives the command's output (stdout and stderr
	// interleaved, as on the console) line by line while it runs.
	Output io.Writer
	// Console, if set, receives the raw serial console (kernel messages
	// included), for debugging boots.
	Console io.Writer
	// Watchdog bounds the command in the guest: past it, the guest prints
	// every task's state and kernel stack and powers off, and Run returns
	// an error carrying that report. Zero means: 30 s before ctx's
	// deadline (at least 20 s after boot); none without a deadline.
	Watchdog time.Duration
}

// Result is the outcome of a boot that ran the command to its end.
type Result struct {
	// Output is what the command printed (stdout and stderr interleaved),
	// with the console's "\r\n" turned back into "\n".
	Output string
	// ExitCode is the command's exit status as the guest shell saw it
	// (128+N if it died of signal N).
	ExitCode int
	// Console is the full serial console log.
	Console string
	// Boot is the time from starting qemu until it exited.
	Boot time.Duration
}

// Paths of what hack/vm-deps.sh prepares.
type paths struct {
	cache, kernel, busybox, qemu string
}

// CacheDir returns the directory hack/vm-deps.sh fills: $CPUSLOT_VM_CACHE,
// or .cache/vm at the root of the cpuslot module.
func CacheDir() (string, error) {
	if d := os.Getenv("CPUSLOT_VM_CACHE"); d != "" {
		return filepath.Abs(d)
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ".cache", "vm"), nil
}

const modulePath = "github.com/cpuslot/cpuslot"

// moduleRoot finds the cpuslot module root: upwards from the working
// directory (go test runs tests in their package directory), else from this
// source file.
func moduleRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
				if strings.HasPrefix(string(data), "module "+modulePath+"\n") ||
					strings.Contains(string(data), "\nmodule "+modulePath+"\n") {
					return dir, nil
				}
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("cannot find the root of module %s (set CPUSLOT_VM_CACHE)", modulePath)
}

func findPaths() (paths, error) {
	cache, err := CacheDir()
	if err != nil {
		return paths{}, err
	}
	p := paths{
		cache:   cache,
		kernel:  filepath.Join(cache, "vmlinux"),
		busybox: filepath.Join(cache, "busybox"),
	}
	// Prefer the uncompressed ELF kernel: qemu enters it directly (PVH),
	// while a bzImage spends ~3 s of emulated time decompressing itself.
	if _, err := os.Stat(p.kernel); err != nil {
		p.kernel = filepath.Join(cache, "vmlinuz")
	}
	var missing []string
	if p.qemu, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		missing = append(missing, "qemu-system-x86_64 (not in PATH)")
	}
	for _, f := range []string{p.kernel, p.busybox} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return p, fmt.Errorf("cgroup v2 VM unavailable, missing %s; run hack/vm-deps.sh (as root) to install it",
			strings.Join(missing, ", "))
	}
	return p, nil
}

// Available reports whether qemu, the kernel and busybox are in place; the
// error says what is missing and how to get it.
func Available() error {
	_, err := findPaths()
	return err
}

// Run boots the guest, runs opts.Command and returns its output and exit
// code. An error means the command did not run to its end: the guest did not
// boot, setup failed, the kernel panicked, or ctx expired (qemu is killed
// then). A non-zero exit code of the command is not an error.
//
// Boots are serialized across processes (a lock file in the cache dir):
// emulation is CPU-bound and `go test ./...` runs packages in parallel.
func Run(ctx context.Context, opts Options) (*Result, error) {
	if len(opts.Command) == 0 {
		return nil, errors.New("vm: Options.Command is empty")
	}
	p, err := findPaths()
	if err != nil {
		return nil, err
	}
	if opts.MemoryMB == 0 {
		opts.MemoryMB = 1024
	}
	if opts.CPUs == 0 {
		opts.CPUs = 2
	}

	tmp, err := os.MkdirTemp("", "cpuslot-vm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	nonce := make([]byte, 8)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	n := hex.EncodeToString(nonce)
	shares, err := validateShares(opts.Shares)
	if err != nil {
		return nil, err
	}
	files := opts.Files
	var modules []string
	if len(shares) > 0 {
		mods, err := shareModules(p.cache)
		if err != nil {
			return nil, err
		}
		files = make(map[string]string, len(opts.Files)+len(mods))
		for g, h := range opts.Files {
			files[g] = h
		}
		for _, m := range mods {
			g := guestModuleDir + "/" + filepath.Base(m)
			files[g] = m
			modules = append(modules, g)
		}
	}
	derived := opts.Watchdog == 0 // from ctx's deadline, not asked for
	if derived {
		if dl, ok := ctx.Deadline(); ok {
			opts.Watchdog = max(time.Until(dl)-30*time.Second, 20*time.Second)
		}
	}
	initrd := filepath.Join(tmp, "initrd.gz")
	if err := writeInitramfs(initrd, p.busybox, initScript(opts, n, modules, shares), files, opts.Symlinks); err != nil {
		return nil, err
	}

	waitStart := time.Now()
	unlock, err := lockBoot(ctx, filepath.Join(p.cache, "qemu.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	// The watchdog counts from boot; time spent waiting for another boot
	// comes off one derived from ctx's deadline, so the report still
	// arrives before ctx expires. One the caller asked for stays as asked.
	waited := time.Since(waitStart)
	if derived && opts.Watchdog > 0 && waited > time.Second {
		if _, ok := ctx.Deadline(); ok {
			// Never longer than asked: a short watchdog stays short.
			opts.Watchdog = max(opts.Watchdog-waited, min(opts.Watchdog, 20*time.Second))
			if err := writeInitramfs(initrd, p.busybox, initScript(opts, n, modules, shares), files, opts.Symlinks); err != nil {
				return nil, err
			}
		}
	}

	// no_timer_check: under TCG on a busy host the IO-APIC timer check can miss its
	// ticks and panic the boot ("IO-APIC + timer doesn't work!"); the timer works.
	cmdline := append([]string{"console=ttyS0", "quiet", "panic=-1", "no_timer_check"}, opts.KernelArgs...)
	args := []string{
		"-m", strconv.Itoa(opts.MemoryMB),
		"-smp", strconv.Itoa(opts.CPUs),
		"-nographic", "-no-reboot",
		// The guest has no network drivers; no NIC also skips iPXE.
		"-nic", "none",
		"-kernel", p.kernel,
		"-initrd", initrd,
		"-append", strings.Join(cmdline, " "),
	}
	args = append(args, qemuShareArgs(shares)...)
	cmd := exec.CommandContext(ctx, p.qemu, args...)
	// Do not leave an emulator spinning if the test process dies. (Pdeathsig
	// fires when the starting OS thread exits; Go keeps threads alive
	// unless a goroutine exits while locked to one.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.WaitDelay = 5 * time.Second

	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting qemu: %w", err)
	}
	c := newConsoleParser(n, opts.Output)
	// Once the command has ended, qemu has only to power off; do not let a
	// guest that fails to do so hold the test until ctx expires.
	var powerOff *time.Timer
	c.onEnd = func() {
		powerOff = time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
	}
	var raw io.Reader = stdout
	if opts.Console != nil {
		raw = io.TeeReader(stdout, opts.Console)
	}
	// A guest that stops printing its heartbeat is hung (its kernel, not
	// the command: the watchdog covers a hung command); stop waiting.
	stalled := make(chan time.Duration, 1)
	stopCheck := make(chan struct{})
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopCheck:
				return
			case <-tick.C:
				// Before the command begins, the boot itself must end in
				// time (seconds normally, well under a minute loaded).
				if quiet := c.silence(start); quiet > StallTimeout {
					stalled <- quiet
					cmd.Process.Kill()
					return
				}
			}
		}
	}()
	readErr := c.read(raw)
	close(stopCheck)
	waitErr := cmd.Wait()
	if powerOff != nil {
		powerOff.Stop()
	}
	res := &Result{
		Output:   c.output.String(),
		ExitCode: c.exitCode,
		Console:  c.console.String(),
		Boot:     time.Since(start),
	}

	var stall time.Duration
	select {
	case stall = <-stalled:
	default:
	}
	switch {
	case stall > 0:
		return res, fmt.Errorf("vm: %w: no heartbeat for %v after %v (the guest's kernel stopped); console tail:\n%s",
			ErrGuestStalled, stall.Round(time.Second), res.Boot.Round(time.Millisecond), tail(res.Console, 60))
	case c.watchdog != "":
		return res, fmt.Errorf("vm: guest watchdog: the command was still running when it fired (%s of the guest's time; qemu ran %v, after waiting %v for another boot); guest report:\n%s",
			c.watchdog, res.Boot.Round(time.Millisecond), waited.Round(time.Millisecond), tail(c.report.String(), 400))
	case ctx.Err() != nil:
		return res, fmt.Errorf("vm: %w after %v, qemu killed; console tail:\n%s",
			ctx.Err(), res.Boot.Round(time.Millisecond), tail(res.Console, 40))
	case c.setupFailed != "":
		return res, fmt.Errorf("vm: guest setup failed: %s; console tail:\n%s", c.setupFailed, tail(res.Console, 40))
	case !c.ended:
		why := "the end marker never appeared (kernel panic, or qemu failed)"
		if !c.begun {
			why = "the command never started (boot failed or kernel panic)"
		}
		return res, fmt.Errorf("vm: %s; qemu: %v %s; console tail:\n%s",
			why, waitErr, strings.TrimSpace(stderr.String()), tail(res.Console, 40))
	case readErr != nil:
		return res, fmt.Errorf("vm: reading the console: %w", readErr)
	}
	return res, nil
}

// consoleParser splits the serial console into the command's output (between
// the markers) and the rest.
type consoleParser struct {
	nonce       string
	stream      io.Writer
	console     strings.Builder
	output      strings.Builder
	begun       bool
	ended       bool
	exitCode    int
	setupFailed string
	onEnd       func()
	// watchdog is set ("after Ns") once the guest watchdog fired; report
	// holds the console from then on.
	watchdog string
	report   strings.Builder
	// lastBeat is when the guest last showed it runs (a heartbeat, or the
	// start of the command); zero before.
	mu       sync.Mutex
	lastBeat time.Time
	begunAt  bool // begun, for the stall check (under mu)
}

// StallTimeout is how long Run waits for the guest's heartbeat (every
// 5 s) before it takes the guest for hung: generous, since a loaded host
// slows the emulated guest.
var StallTimeout = 2 * time.Minute

// ErrGuestStalled means the guest stopped printing its heartbeat: its
// kernel hung, as emulated guests rarely do; the command may not be at
// fault (RunGoTest boots once more).
var ErrGuestStalled = errors.New("guest stalled")

func (c *consoleParser) beat() {
	c.mu.Lock()
	c.lastBeat = time.Now()
	c.mu.Unlock()
}

// silence is how long the guest has been without a sign of life: since
// its last heartbeat while the command runs, since boot (started) before
// the command began, zero after it ended.
func (c *consoleParser) silence(started time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.lastBeat.IsZero():
		return time.Since(c.lastBeat)
	case !c.begunAt:
		return time.Since(started)
	}
	return 0
}

func newConsoleParser(nonce string, stream io.Writer) *consoleParser {
	return &consoleParser{nonce: nonce, stream: stream, exitCode: -1}
}

func (c *consoleParser) read(r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			c.line(line)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (c *consoleParser) line(line string) {
	if hb := markerHeartbeat + c.nonce + "@@"; strings.Contains(line, hb) {
		c.beat()
		line = strings.Replace(line, hb, "", 1)
		if strings.TrimRight(line, "\r\n") == "" {
			return
		}
	}
	c.console.WriteString(line)
	if c.watchdog != "" {
		c.report.WriteString(line)
	} else if i := strings.Index(line, markerWatchdog+c.nonce+" "); i >= 0 {
		c.watchdog = strings.TrimSuffix(strings.TrimRight(line[i+len(markerWatchdog+c.nonce+" "):], "\r\n"), "@@")
		c.report.WriteString(line[i:])
		return
	}
	if c.ended {
		return
	}
	// The guest tty turns "\n" into "\r\n".
	text := strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
	nl := len(text) < len(line)
	if !c.begun {
		if i := strings.Index(text, markerFail+c.nonce+" "); i >= 0 {
			c.setupFailed = strings.TrimSuffix(text[i+len(markerFail+c.nonce+" "):], "@@")
		} else if strings.Contains(text, markerBegin+c.nonce+"@@") {
			c.begun = true
			c.mu.Lock()
			c.begunAt = true
			c.mu.Unlock()
			c.beat()
		}
		return
	}
	// The end marker may follow output that did not end with a newline.
	if i := strings.Index(text, markerEnd+c.nonce+" exit="); i >= 0 {
		rest := strings.TrimSuffix(text[i+len(markerEnd+c.nonce+" exit="):], "@@")
		if code, err := strconv.Atoi(rest); err == nil {
			c.ended, c.exitCode = true, code
			c.mu.Lock()
			c.lastBeat = time.Time{}
			c.mu.Unlock()
			text, nl = text[:i], false
			if c.onEnd != nil {
				c.onEnd()
			}
		}
	}
	if text == "" && !nl {
		return
	}
	if nl {
		text += "\n"
	}
	c.output.WriteString(text)
	if c.stream != nil {
		io.WriteString(c.stream, text)
	}
}

// ansiEscape matches the terminal control sequences firmware writes.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[a-zA-Z]|\x1bc`)

// tail returns the last n lines of s.
func tail(s string, n int) string {
	s = ansiEscape.ReplaceAllString(s, "")
	s = strings.ReplaceAll(strings.TrimRight(s, "\r\n"), "\r\n", "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  | " + strings.Join(lines, "\n  | ")
}

var bootMu sync.Mutex

// lockBoot serializes boots within the process and, with a flock on path,
// across processes. It gives up when ctx is done.
func lockBoot(ctx context.Context, path string) (func(), error) {
	locked := make(chan struct{})
	go func() { bootMu.Lock(); close(locked) }()
	select {
	case <-locked:
	case <-ctx.Done():
		go func() { <-locked; bootMu.Unlock() }()
		return nil, fmt.Errorf("vm: waiting for another boot: %w", ctx.Err())
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		bootMu.Unlock()
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			bootMu.Unlock()
			return nil, fmt.Errorf("vm: locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			bootMu.Unlock()
			return nil, fmt.Errorf("vm: waiting for another process's boot: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return func() { f.Close(); bootMu.Unlock() }, nil
}
