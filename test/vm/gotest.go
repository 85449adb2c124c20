package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
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

// EnvInVM is set to "1" for commands that RunGoTest runs in the guest.
const EnvInVM = "CPUSLOT_IN_VM"

// EnvRequireVM makes Require fail instead of skip when set to "1" (CI sets
// it, so VM tests cannot pass by silently skipping).
const EnvRequireVM = "CPUSLOT_REQUIRE_VM"

// InGuest reports whether this process runs inside the VM under RunGoTest.
// Guest-side tests start with:
//
//	if !vm.InGuest() { t.Skip("runs in the cgroup v2 VM, via TestXxx") }
func InGuest() bool { return os.Getenv(EnvInVM) == "1" }

// Require skips t if the VM is unavailable, or fails it if
// CPUSLOT_REQUIRE_VM=1.
func Require(t testing.TB) {
	t.Helper()
	err := Available()
	if err == nil {
		return
	}
	if os.Getenv(EnvRequireVM) == "1" {
		t.Fatalf("%v (%s=1, so not skipping)", err, EnvRequireVM)
	}
	t.Skip(err)
}

// BuildTestBinary builds the test binary of package pkg into out, statically
// linked (CGO_ENABLED=0) so it runs in the busybox guest. pkg is an import
// path or a pattern relative to the module root ("./internal/cgroup").
func BuildTestBinary(pkg string, out string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	out, err = filepath.Abs(out)
	if err != nil {
		return err
	}
	cmd := exec.Command("go", "test", "-c", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go test -c %s: %w\n%s", pkg, err, buf.String())
	}
	// go test -c writes nothing, successfully, for a package without tests.
	if _, err := os.Stat(out); err != nil {
		return fmt.Errorf("go test -c %s produced no binary (no test files?): %w", pkg, err)
	}
	return nil
}

var (
	buildMu    sync.Mutex
	builtTests = map[string]string{} // pkg -> binary, per process
)

// testBinary builds pkg's test binary once per process, into the VM cache
// dir (gitignored), so that several RunGoTest calls share one build.
func testBinary(pkg string) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := builtTests[pkg]; ok {
		return bin, nil
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	// One directory per test process: the cache is the machine's, and
	// another checkout's tests may be building the same package, from
	// other sources, at the same time. Directories of processes that are
	// gone are removed.
	bins := filepath.Join(cache, "bin")
	if old, err := os.ReadDir(bins); err == nil {
		for _, e := range old {
			if pid, err := strconv.Atoi(e.Name()); err == nil && e.IsDir() && syscall.Kill(pid, 0) == syscall.ESRCH {
				os.RemoveAll(filepath.Join(bins, e.Name()))
			}
		}
	}
	dir := filepath.Join(bins, strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Build under a private name, then rename.
	name := strings.NewReplacer("/", "_", ".", "_").Replace(strings.TrimPrefix(pkg, modulePath+"/")) + ".test"
	f, err := os.CreateTemp(dir, name+".*")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	f.Close()
	if err := BuildTestBinary(pkg, tmp); err != nil {
		os.Remove(tmp)
		return "", err
	}
	bin := filepath.Join(dir, name)
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	builtTests[pkg] = bin
	return bin, nil
}

// RunGoTest runs the tests of package pkg that match runRegex inside the
// guest, as `pkg.test -test.v -test.run runRegex [opts.Command...]` with
// CPUSLOT_IN_VM=1, printing their output through t.Log as it arrives. It
// fails t if the guest does not boot or the tests fail, and skips t (or fails
// it, see Require) if the VM is unavailable.
//
// In opts, Command holds extra test flags (e.g. "-test.count=3"); Env,
// Files, MountOptions and the rest apply as for Run. The run is bounded by
// t's deadline (go test -timeout) and by 10 minutes.
func RunGoTest(t testing.TB, pkg, runRegex string, opts Options) *Result {
	t.Helper()
	Require(t)
	bin, err := testBinary(pkg)
	if err != nil {
		t.Fatal(err)
	}
	guestBin := "/bin/" + path.Base(bin)
	files := map[string]string{guestBin: bin}
	for g, h := range opts.Files {
		files[g] = h
	}
	opts.Files = files
	opts.Command = append([]string{guestBin, "-test.v", "-test.run", runRegex}, opts.Command...)
	opts.Env = append([]string{EnvInVM + "=1"}, opts.Env...)
	if opts.Output == nil {
		opts.Output = &lineLogger{t: t}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			// Leave time to report before go test's own timeout panics.
			ctx, cancel = context.WithDeadline(ctx, dl.Add(-10*time.Second))
			defer cancel()
		}
	}
	res, err := Run(ctx, opts)
	if lw, ok := opts.Output.(*lineLogger); ok {
		lw.flush()
	}
	if errors.Is(err, ErrGuestStalled) && ctx.Err() == nil {
		// The guest's kernel stopped, not the tests: boot once more, and
		// say so. A second stall fails the test.
		t.Logf("vm: %v\nvm: booting once more", err)
		res, err = Run(ctx, opts)
		if lw, ok := opts.Output.(*lineLogger); ok {
			lw.flush()
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vm: %s -test.run %q exited %d; boot to poweroff %v", path.Base(bin), runRegex, res.ExitCode, res.Boot.Round(time.Millisecond))
	if res.ExitCode != 0 {
		t.Fatalf("vm: guest tests of %s failed (exit code %d)", pkg, res.ExitCode)
	}
	// A filter matching nothing is an easy mistake that would pass silently.
	if strings.Contains(res.Output, "testing: warning: no tests to run") {
		t.Fatalf("vm: -test.run %q matched no test in %s", runRegex, pkg)
	}
	return res
}

// lineLogger passes whole lines to t.Log.
type lineLogger struct {
	t   testing.TB
	buf []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.t.Log("guest: " + string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
}

func (l *lineLogger) flush() {
	if len(l.buf) > 0 {
		l.t.Log("guest: " + string(l.buf))
		l.buf = nil
	}
}

// KernelMarker is the call that marks a kernel test (cgrouptest.Kernel).
const KernelMarker = "cgrouptest.Kernel"

// KernelMarkerPackage is the package of KernelMarker.
const KernelMarkerPackage = modulePath + "/internal/cgroup/cgrouptest"

// RunKernelTests runs the kernel tests of package pkg in the guest, as
// RunGoTest does: every Test function of the package that calls
// cgrouptest.Kernel, directly or through functions of its own test files.
// The selection comes from the source (KernelTests), not from a list kept
// by hand. In the guest itself it skips t: the calling test is the host's
// driver.
func RunKernelTests(t testing.TB, pkg string, opts Options) *Result {
	t.Helper()
	if InGuest() {
		t.Skip("already in the VM")
	}
	names, err := KernelTests(pkg)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatalf("vm: no test of %s calls %s", pkg, KernelMarker)
	}
	t.Logf("vm: %d kernel tests of %s: %s", len(names), pkg, strings.Join(names, " "))
	return RunGoTest(t, pkg, "^("+strings.Join(names, "|")+")$", opts)
}

// KernelTests lists the Test functions of package pkg (an import path in
// this module) that reach KernelMarker: they call it, or call (or refer to)
// a function or method of the package's test files, or of a test helper
// package of this module they import (its name ends in "test", such as
// agenttest), that does, at any depth.
func KernelTests(pkg string) ([]string, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	rel, ok := strings.CutPrefix(pkg, modulePath)
	if !ok || (rel != "" && rel[0] != '/') {
		return nil, fmt.Errorf("vm: %s is not a package of %s", pkg, modulePath)
	}
	dir := filepath.Join(root, filepath.FromSlash(rel))
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	// uses: function name -> names it refers to; marked: calls the marker.
	uses := map[string]map[string]bool{}
	marked := map[string]bool{}
	var tests []string
	fset := token.NewFileSet()
	helpers := map[string]bool{} // test helper packages' directories, read once
	for i := 0; i < len(files); i++ {
		f := files[i]
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		inTest := strings.HasSuffix(f, "_test.go")
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			hrel, ok := strings.CutPrefix(p, modulePath+"/")
			if !ok || !strings.HasSuffix(path.Base(p), "test") || p == KernelMarkerPackage {
				continue
			}
			hdir := filepath.Join(root, filepath.FromSlash(hrel))
			if helpers[hdir] {
				continue
			}
			helpers[hdir] = true
			hfiles, _ := filepath.Glob(filepath.Join(hdir, "*.go"))
			for _, hf := range hfiles {
				if !strings.HasSuffix(hf, "_test.go") {
					files = append(files, hf)
				}
			}
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := fd.Name.Name
			if inTest && fd.Recv == nil && strings.HasPrefix(name, "Test") && name != "TestMain" {
				tests = append(tests, name)
			}
			if uses[name] == nil {
				uses[name] = map[string]bool{}
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.SelectorExpr:
					if id, ok := x.X.(*ast.Ident); ok && id.Name+"."+x.Sel.Name == KernelMarker {
						marked[name] = true
					}
					uses[name][x.Sel.Name] = true // a method of the package's test types
				case *ast.Ident:
					uses[name][x.Name] = true
				}
				return true
			})
		}
	}
	for changed := true; changed; {
		changed = false
		for fn, refs := range uses {
			if marked[fn] {
				continue
			}
			for r := range refs {
				if marked[r] && r != fn {
					marked[fn], changed = true, true
					break
				}
			}
		}
	}
	var out []string
	for _, name := range tests {
		if marked[name] {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, nil
}
