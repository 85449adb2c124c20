package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestSmoke boots the guest twice and runs TestGuestCgroupV2 of this
// package's own test binary in it: with cgroup2 mounted plain and with
// favordynmods. It is also the example of RunGoTest for other packages.
func TestSmoke(t *testing.T) {
	for _, mountOpts := range []string{"", "favordynmods"} {
		t.Run("mount="+mountOpts, func(t *testing.T) {
			res := RunGoTest(t, modulePath+"/test/vm", "^TestGuestCgroupV2$", Options{
				MountOptions: mountOpts,
				Env:          []string{"SMOKE_MOUNT_OPTIONS=" + mountOpts},
			})
			if !strings.Contains(res.Output, "--- PASS: TestGuestCgroupV2") {
				t.Errorf("guest test did not report a pass")
			}
		})
	}
}

// TestRunExitCode checks Run's plumbing with busybox alone: argv quoting,
// env, output between markers without a final newline, and the exit code.
func TestRunExitCode(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{
		Command: []string{"sh", "-c", `echo "$1 $GREETING"; printf 'no newline'; exit 7`, "sh", "it's"},
		Env:     []string{"GREETING=hello world"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("boot to poweroff: %v", res.Boot.Round(time.Millisecond))
	if want := "it's hello world\nno newline"; res.Output != want {
		t.Errorf("output %q, want %q", res.Output, want)
	}
	if res.ExitCode != 7 {
		t.Errorf("exit code %d, want 7", res.ExitCode)
	}
}

// TestRunTimeout checks that an expired ctx kills qemu and says so.
func TestRunTimeout(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Run(ctx, Options{Command: []string{"sleep", "600"}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("Run returned %v after the deadline", d)
	}
}

// TestRunErrors checks that a guest that never runs the command is an error
// that shows why.
func TestRunErrors(t *testing.T) {
	Require(t)
	for _, tc := range []struct {
		name string
		opts Options
		want []string
	}{
		// No /init: the kernel panics; panic=-1 and -no-reboot end qemu.
		{"panic", Options{KernelArgs: []string{"rdinit=/nonexistent"}}, []string{"never started", "Kernel panic"}},
		{"setup", Options{MountOptions: "nosuchoption"}, []string{"guest setup failed: mount cgroup2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Command = []string{"true"}
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			_, err := Run(ctx, tc.opts)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestConsoleParser(t *testing.T) {
	const n = "abc"
	console := "SeaBIOS\r\n[ 1.0] kernel says hi\r\n" +
		markerBegin + n + "@@\r\n" +
		"line 1\r\n" +
		"partial" + markerEnd + n + " exit=3@@\r\n" +
		"[ 2.0] reboot: Power down\r\n"
	var streamed strings.Builder
	c := newConsoleParser(n, &streamed)
	if err := c.read(strings.NewReader(console)); err != nil {
		t.Fatal(err)
	}
	if !c.begun || !c.ended || c.exitCode != 3 {
		t.Fatalf("begun=%v ended=%v exit=%d", c.begun, c.ended, c.exitCode)
	}
	if want := "line 1\npartial"; c.output.String() != want || streamed.String() != want {
		t.Errorf("output %q, streamed %q, want %q", c.output.String(), streamed.String(), want)
	}

	c = newConsoleParser(n, nil)
	c.read(strings.NewReader(markerFail + n + " mount cgroup2@@\r\n"))
	if c.setupFailed != "mount cgroup2" || c.begun {
		t.Errorf("setupFailed=%q begun=%v", c.setupFailed, c.begun)
	}
}

// TestGuestCgroupV2 runs inside the guest (see TestSmoke). It walks through
// creating a slot the way the agent does and moves a thread into it by
// writing "0" to an fd of the slot's cgroup.threads.
func TestGuestCgroupV2(t *testing.T) {
	if !InGuest() {
		t.Skip("runs in the cgroup v2 VM, via TestSmoke")
	}
	const root = "/sys/fs/cgroup"
	mountOpts := os.Getenv("SMOKE_MOUNT_OPTIONS")

	// The mount carries favordynmods exactly when asked for.
	super := cgroup2SuperOptions(t, root)
	t.Logf("cgroup2 super options: %s", super)
	if got, want := hasField(super, ",", "favordynmods"), mountOpts == "favordynmods"; got != want {
		t.Fatalf("favordynmods in %q = %v, want %v", super, got, want)
	}
	if !hasField(readFile(t, root+"/cgroup.controllers"), " ", "cpu") {
		t.Fatal("cpu controller not available on the cgroup2 root")
	}

	// A container cgroup with this process in it, and a threaded slot.
	c1, slot := root+"/c1", root+"/c1/slot"
	mkdir(t, c1)
	writeFile(t, c1+"/cgroup.procs", strconv.Itoa(os.Getpid()))
	mkdir(t, slot)
	writeFile(t, slot+"/cgroup.type", "threaded")
	writeFile(t, c1+"/cgroup.subtree_control", "+cpu")
	writeFile(t, slot+"/cpu.max", "50000 100000")
	if got := readFile(t, slot+"/cpu.max"); got != "50000 100000" {
		t.Errorf("slot cpu.max = %q", got)
	}
	if got := readFile(t, c1+"/cgroup.type"); got != "domain threaded" {
		t.Errorf("c1 cgroup.type = %q, want domain threaded", got)
	}

	threads, err := os.OpenFile(slot+"/cgroup.threads", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer threads.Close()
	type moved struct {
		cgroup string
		err    error
	}
	done := make(chan moved)
	go func() {
		// Never unlocked: the thread, now in the slot, exits with the
		// goroutine instead of running other goroutines.
		runtime.LockOSThread()
		if _, err := threads.Write([]byte("0")); err != nil {
			done <- moved{err: err}
			return
		}
		cg, err := os.ReadFile("/proc/thread-self/cgroup")
		done <- moved{strings.TrimSpace(string(cg)), err}
	}()
	m := <-done
	if m.err != nil {
		t.Fatalf("moving a thread by writing 0: %v", m.err)
	}
	if m.cgroup != "0::/c1/slot" {
		t.Errorf("moved thread is in %q, want 0::/c1/slot", m.cgroup)
	}
	runtime.LockOSThread()
	if cg := readFile(t, "/proc/thread-self/cgroup"); cg != "0::/c1" {
		t.Errorf("another thread is in %q, want 0::/c1", cg)
	}
	runtime.UnlockOSThread()

	// Documented kernel behaviour, checked so that a kernel change shows.
	// cgroup v2 refuses rename(2) of a cgroup directory.
	mkdir(t, root+"/r1")
	if err := os.Rename(root+"/r1", root+"/r2"); err == nil {
		t.Errorf("rename of a cgroup2 directory succeeded")
	} else {
		t.Logf("rename of a cgroup2 directory: %v", err)
	}
	// favordynmods can be turned on by a remount as well as at mount time.
	if mountOpts == "" {
		if err := syscall.Mount("", root, "", syscall.MS_REMOUNT, "favordynmods"); err != nil {
			t.Fatalf("remount with favordynmods: %v", err)
		}
		if super := cgroup2SuperOptions(t, root); !hasField(super, ",", "favordynmods") {
			t.Errorf("after remount, super options %q lack favordynmods", super)
		}
	}
}

// cgroup2SuperOptions returns the super options of the cgroup2 mount at dir,
// from /proc/self/mountinfo.
func cgroup2SuperOptions(t *testing.T, dir string) string {
	t.Helper()
	for _, line := range strings.Split(readFile(t, "/proc/self/mountinfo"), "\n") {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 5 && len(g) >= 3 && f[4] == dir && g[0] == "cgroup2" {
			return g[2]
		}
	}
	t.Fatalf("no cgroup2 mount at %s", dir)
	return ""
}

func hasField(s, sep, field string) bool {
	for _, f := range strings.Split(s, sep) {
		if f == field {
			return true
		}
	}
	return false
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0); err != nil {
		t.Fatalf("writing %q to %s: %v", data, filepath.Base(filepath.Dir(name))+"/"+filepath.Base(name), err)
	}
}

func mkdir(t *testing.T, name string) {
	t.Helper()
	if err := os.Mkdir(name, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestShareSetup checks, without booting, how Shares and Symlinks become
// qemu arguments and /init lines, and what is refused.
func TestShareSetup(t *testing.T) {
	host := t.TempDir()
	shares, err := validateShares(map[string]string{"/opt/b": host, "/opt/a": host})
	if err != nil {
		t.Fatal(err)
	}
	if len(shares) != 2 || shares[0].guest != "/opt/a" || shares[0].tag != "cpuslot0" || shares[1].tag != "cpuslot1" {
		t.Fatalf("shares = %+v", shares)
	}
	args := strings.Join(qemuShareArgs(shares), " ")
	for _, w := range []string{"path=" + host + ",", "readonly=on", "mount_tag=cpuslot1"} {
		if !strings.Contains(args, w) {
			t.Errorf("qemu args lack %q: %s", w, args)
		}
	}

	plain := initScript(Options{Command: []string{"true"}}, "n", nil, nil)
	if strings.Contains(plain, "insmod") || strings.Contains(plain, "9p") {
		t.Errorf("/init without shares loads or mounts something:\n%s", plain)
	}
	script := initScript(Options{Command: []string{"true"}}, "n", []string{guestModuleDir + "/a.ko", guestModuleDir + "/b.ko"}, shares)
	ia, ib := strings.Index(script, "/a.ko"), strings.Index(script, "/b.ko")
	im := strings.Index(script, "mount -t 9p")
	if ia < 0 || ib < ia || im < ib || !strings.Contains(script, "ro,msize=") || !strings.Contains(script, "cpuslot0 '/opt/a'") {
		t.Errorf("/init does not insmod in order, then mount read-only:\n%s", script)
	}

	for _, bad := range []map[string]string{
		{"relative": host},
		{"/opt/../etc": host},
		{"/proc/x": host},
		{"/tmp": host},
		{"/opt/x": filepath.Join(host, "missing")},
	} {
		if _, err := validateShares(bad); err == nil {
			t.Errorf("validateShares(%v) accepted", bad)
		}
	}
}

func TestShareHostLibraries(t *testing.T) {
	var o Options
	if err := o.ShareHostLibraries(); err != nil {
		t.Fatal(err)
	}
	t.Logf("shares %v, symlinks %v", o.Shares, o.Symlinks)
	for _, dir := range hostLibraryDirs {
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		if o.Shares[dir] == "" && o.Symlinks[dir] == "" {
			t.Errorf("%s is neither shared nor linked", dir)
		}
	}
	for l, target := range o.Symlinks {
		resolved := target
		if !filepath.IsAbs(target) {
			resolved = filepath.Join(filepath.Dir(l), target)
		}
		if o.Shares[resolved] != resolved {
			t.Errorf("link %s -> %s does not reach a share", l, target)
		}
	}
}

func TestJavaVersion(t *testing.T) {
	dir := t.TempDir()
	for content, want := range map[string]string{
		`JAVA_VERSION="25.0.3"`:      "[25 0 3]",
		`JAVA_VERSION="1.8.0_402"`:   "[8 0 402]",
		`JAVA_VERSION="17"`:          "[17]",
		"IMPLEMENTOR=\"x\"\nfoo=bar": "[]",
	} {
		f := filepath.Join(dir, "release")
		if err := os.WriteFile(f, []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(javaVersion(f)); got != want {
			t.Errorf("javaVersion(%q) = %s, want %s", content, got, want)
		}
	}
}

// TestRunRefusesBadShares checks that bad Shares and Symlinks fail before
// qemu starts.
func TestRunRefusesBadShares(t *testing.T) {
	Require(t)
	for _, opts := range []Options{
		{Shares: map[string]string{"/x": filepath.Join(t.TempDir(), "missing")}},
		{Symlinks: map[string]string{"/bin": "usr/bin"}},
		{Symlinks: map[string]string{"/app": "x"}, Files: map[string]string{"/app/f": "/etc/hostname"}},
	} {
		opts.Command = []string{"true"}
		res, err := Run(t.Context(), opts)
		if err == nil || res != nil {
			t.Errorf("Run(%+v) = %v, %v; want an error before booting", opts, res, err)
		} else {
			t.Log(err)
		}
	}
}

// TestWatchdog checks that a command that hangs in the guest ends the boot
// with the guest's own report of what every task was doing, well before
// the host's deadline.
func TestWatchdog(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	_, err := Run(ctx, Options{Command: []string{"sleep", "600"}, Watchdog: 3 * time.Second})
	if err == nil {
		t.Fatal("a hung command returned no error")
	}
	if ctx.Err() != nil {
		t.Fatalf("the host deadline expired first (%v): %v", time.Since(start), err)
	}
	for _, w := range []string{"guest watchdog", "after 3s", "sleep", "State:"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

// TestStallDetected checks that a guest that stops printing its heartbeat
// is reported as stalled long before the host's deadline. SIGSTOP on the
// emulator stands in for a guest whose kernel stopped.
func TestStallDetected(t *testing.T) {
	Require(t)
	for _, beforeBegin := range []bool{false, true} {
		t.Run(fmt.Sprintf("beforeBegin=%v", beforeBegin), func(t *testing.T) { testStall(t, beforeBegin) })
	}
}

func testStall(t *testing.T, beforeBegin bool) {
	defer func(d time.Duration) { StallTimeout = d }(StallTimeout)
	StallTimeout = 15 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var console syncBuffer
	go func() {
		// Stop the emulator once the command runs, or (beforeBegin) as
		// soon as it boots.
		for !beforeBegin && !strings.Contains(console.String(), markerBegin) {
			time.Sleep(100 * time.Millisecond)
		}
		for beforeBegin && !strings.Contains(console.String(), "SeaBIOS") {
			time.Sleep(10 * time.Millisecond)
		}
		out, _ := exec.Command("pkill", "-STOP", "-f", "cpuslot-stall-test").CombinedOutput()
		t.Logf("pkill -STOP: %s", out)
	}()
	_, err := Run(ctx, Options{Command: []string{"sleep", "600"}, Console: &console,
		KernelArgs: []string{"cpuslot-stall-test"}})
	if !errors.Is(err, ErrGuestStalled) {
		t.Fatalf("err = %v, want ErrGuestStalled", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the host deadline expired first")
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestKernelTests: the kernel tests of a package are the ones that reach
// cgrouptest.Kernel, directly, through helpers or methods (of the test
// files or of a test helper package), or through a
// function passed to t.Run; TestMain and the others are not.
func TestKernelTests(t *testing.T) {
	got, err := KernelTests(modulePath + "/test/vm/testdata/kernelpkg")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"TestDirect", "TestHelperAsValue", "TestThroughHelper", "TestThroughHelperPackage", "TestThroughMethod"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("kernel tests %v, want %v", got, want)
	}
	if _, err := KernelTests("example.com/other"); err == nil {
		t.Fatal("a package outside the module was accepted")
	}
}

// TestEveryKernelPackageRunsOnV2: a package whose tests mark kernel tests
// (cgrouptest.Kernel) must have a test that runs them on cgroup v2
// (RunKernelTests with the package's path); otherwise its kernel tests
// would silently run on the host's hierarchy only.
func TestEveryKernelPackageRunsOnV2(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "runtime-image") {
			return filepath.SkipDir
		}
		if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
			return filepath.SkipDir // another module (e2e, tools)
		}
		rel, _ := filepath.Rel(root, path)
		pkg := modulePath
		if rel != "." {
			pkg += "/" + filepath.ToSlash(rel)
		}
		names, err := KernelTests(pkg)
		if err != nil || len(names) == 0 {
			return err
		}
		checked++
		files, _ := filepath.Glob(filepath.Join(path, "*_test.go"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			if strings.Contains(string(b), "RunKernelTests(") && strings.Contains(string(b), `"`+pkg+`"`) {
				return nil
			}
		}
		t.Errorf("%s has kernel tests (%s) but no test runs them on cgroup v2 (vm.RunKernelTests(t, %q, ...))", pkg, strings.Join(names, " "), pkg)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("found no package with kernel tests")
	}
	t.Logf("%d packages with kernel tests", checked)
}

// TestCPUTicks: the host's view of a silent guest reads qemu's CPU time
// from /proc; this process's own grows while it spins.
func TestCPUTicks(t *testing.T) {
	before, err := cpuTicks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var after uint64
	for after <= before {
		for i := 0; i < 1e7; i++ {
			spin++
		}
		if after, err = cpuTicks(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cpuTicks(-1); err == nil {
		t.Error("cpuTicks(-1): no error")
	}
}

var spin int
