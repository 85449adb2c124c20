package vm

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// Read-only host directory shares (Options.Shares): virtio-9p devices,
// mounted by /init after it has loaded the 9p modules that hack/vm-deps.sh
// keeps from the kernel package. Boots without shares load nothing.

// share is one validated entry of Options.Shares.
type share struct {
	guest, host, tag string
}

const (
	// guestModuleDir holds the 9p modules in the initramfs (not under /lib,
	// which ShareHostLibraries may turn into a symlink).
	guestModuleDir = "/.cpuslot-vm/modules"
	// shareMsize is the 9p message size: the largest the 6.1 virtio
	// transport accepts ((128-3) pages). Bigger messages mean fewer round
	// trips to qemu when the JVM reads its 20 MB libjvm.so and modules.
	shareMsize = 512000
	// shareCache is the guest's 9p cache mode. "loose" keeps pages and
	// metadata in the guest page cache, so a file read twice in one boot
	// (e.g. by two JVM starts) crosses to the host once. Safe because
	// shares are read-only and nothing should change the host side during a
	// boot; the guest would not notice if it did.
	shareCache = "loose"
)

// reservedGuestDirs cannot be mount points (or symlinks): /init and the
// command depend on what the initramfs puts there.
var reservedGuestDirs = []string{"/", "/bin", "/sbin", "/usr/bin", "/usr/sbin", "/dev", "/proc", "/sys", "/tmp", "/run", "/etc", "/root", "/init", "/.cpuslot-vm"}

func isReserved(p string) bool {
	for _, r := range reservedGuestDirs {
		if p == r {
			return true
		}
	}
	// Nothing under the pseudo filesystems.
	for _, r := range []string{"/dev/", "/proc/", "/sys/", "/.cpuslot-vm/"} {
		if strings.HasPrefix(p, r) {
			return true
		}
	}
	return false
}

// cleanGuestPath checks that p is an absolute, clean guest path.
func cleanGuestPath(p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("guest path %q is not absolute", p)
	}
	if c := path.Clean(p); c != p {
		return "", fmt.Errorf("guest path %q is not clean (%q)", p, c)
	}
	if strings.ContainsAny(p, "\n\x00") {
		return "", fmt.Errorf("guest path %q contains a newline or NUL", p)
	}
	return p, nil
}

// validateShares checks opts.Shares and returns them sorted by guest path
// (parents are mounted before what lies under them), with their 9p tags.
func validateShares(shares map[string]string) ([]share, error) {
	var out []share
	for g, h := range shares {
		g, err := cleanGuestPath(g)
		if err != nil {
			return nil, fmt.Errorf("vm: Options.Shares: %w", err)
		}
		if isReserved(g) {
			return nil, fmt.Errorf("vm: Options.Shares: cannot mount over %s in the guest", g)
		}
		// qemu opens the path itself; hand it the real directory.
		real, err := filepath.EvalSymlinks(h)
		if err == nil {
			real, err = filepath.Abs(real)
		}
		if err != nil {
			return nil, fmt.Errorf("vm: Options.Shares[%q]: %w", g, err)
		}
		fi, err := os.Stat(real)
		if err != nil {
			return nil, fmt.Errorf("vm: Options.Shares[%q]: %w", g, err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("vm: Options.Shares[%q]: %s is not a directory", g, h)
		}
		out = append(out, share{guest: g, host: real})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].guest < out[j].guest })
	for i := range out {
		out[i].tag = "cpuslot" + strconv.Itoa(i)
	}
	return out, nil
}

// qemuShareArgs returns the qemu arguments that export shares read-only.
func qemuShareArgs(shares []share) []string {
	var args []string
	for i, s := range shares {
		id := "fs" + strconv.Itoa(i)
		// In qemu's option syntax a comma in a value is written twice.
		host := strings.ReplaceAll(s.host, ",", ",,")
		args = append(args,
			"-fsdev", "local,id="+id+",path="+host+",security_model=none,readonly=on,multidevs=remap",
			"-device", "virtio-9p-pci,fsdev="+id+",mount_tag="+s.tag)
	}
	return args
}

// shareModules returns the host files of the 9p modules in load order, as
// kept by hack/vm-deps.sh, after checking that they belong to the kernel.
func shareModules(cache string) ([]string, error) {
	dir := filepath.Join(cache, "modules")
	missing := fmt.Errorf("vm: Options.Shares needs the 9p kernel modules in %s; run hack/vm-deps.sh (as root) to extract them", dir)
	order, err := os.ReadFile(filepath.Join(dir, "order"))
	if err != nil {
		return nil, missing
	}
	kv, err1 := os.ReadFile(filepath.Join(cache, "kernel-version"))
	mkv, err2 := os.ReadFile(filepath.Join(dir, "kernel-version"))
	if err1 != nil || err2 != nil || strings.TrimSpace(string(kv)) != strings.TrimSpace(string(mkv)) {
		return nil, fmt.Errorf("vm: the 9p modules in %s are not those of the kernel (%s vs %s); run hack/vm-deps.sh",
			dir, strings.TrimSpace(string(mkv)), strings.TrimSpace(string(kv)))
	}
	var files []string
	for _, name := range strings.Fields(string(order)) {
		f := filepath.Join(dir, name+".ko")
		if _, err := os.Stat(f); err != nil {
			return nil, missing
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, missing
	}
	return files, nil
}

// SharesAvailable reports whether boots with Options.Shares can work: the VM
// is available and hack/vm-deps.sh has kept the 9p modules.
func SharesAvailable() error {
	p, err := findPaths()
	if err != nil {
		return err
	}
	_, err = shareModules(p.cache)
	return err
}

// RequireShares is Require for tests that boot with Options.Shares.
func RequireShares(t testing.TB) {
	t.Helper()
	err := SharesAvailable()
	if err == nil {
		return
	}
	if os.Getenv(EnvRequireVM) == "1" {
		t.Fatalf("%v (%s=1, so not skipping)", err, EnvRequireVM)
	}
	t.Skip(err)
}

// hostLibraryDirs are where glibc's loader and libraries live.
var hostLibraryDirs = []string{"/lib", "/lib64", "/usr/lib", "/usr/lib64"}

// ShareHostLibraries adds to o what lets dynamically linked host programs
// (a JDK under /usr/lib/jvm, say) run in the guest at their host paths: the
// host's /lib, /lib64, /usr/lib and /usr/lib64, each a read-only share at
// the same path, or, where the host has merged /usr (/lib -> usr/lib), the
// same symlink in the guest; and the host's /etc/ld.so.cache. Nothing of the
// initramfs is hidden: busybox lives in /bin, /sbin, /usr/bin and /usr/sbin.
//
// Host programs under /usr/bin are not visible (busybox is there); run them
// by their real path (e.g. HostJDK()+"/bin/java").
func (o *Options) ShareHostLibraries() error {
	real := map[string]bool{} // directories that will be shared
	type link struct{ dir, target, resolved string }
	var links []link
	for _, dir := range hostLibraryDirs {
		fi, err := os.Lstat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(dir)
			if err != nil {
				return err
			}
			resolved, err := filepath.EvalSymlinks(dir)
			if err != nil {
				continue // dangling: nothing to share
			}
			links = append(links, link{dir, target, resolved})
			continue
		}
		if fi.IsDir() {
			real[dir] = true
		}
	}
	if o.Shares == nil {
		o.Shares = map[string]string{}
	}
	if o.Symlinks == nil {
		o.Symlinks = map[string]string{}
	}
	for dir := range real {
		o.Shares[dir] = dir
	}
	for _, l := range links {
		if real[l.resolved] {
			// /lib -> usr/lib: the same link reaches the same share.
			o.Symlinks[l.dir] = l.target
		} else {
			// A link elsewhere: share what it points to at its own path.
			o.Shares[l.dir] = l.resolved
		}
	}
	if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
		if o.Files == nil {
			o.Files = map[string]string{}
		}
		o.Files["/etc/ld.so.cache"] = "/etc/ld.so.cache"
	}
	return nil
}

// HostJVMDir is where HostJDK looks for JDKs (Debian's layout).
const HostJVMDir = "/usr/lib/jvm"

// HostJDK returns the real path of a JDK under /usr/lib/jvm, as found by its
// "release" file and bin/java: the newest with the given feature version
// (25 for Java 25), or the newest of all if feature is 0. The JDK lies under
// /usr/lib, so ShareHostLibraries makes it visible in the guest at the same
// path.
func HostJDK(feature int) (string, error) {
	entries, err := os.ReadDir(HostJVMDir)
	if err != nil {
		return "", fmt.Errorf("no JDK: %w", err)
	}
	type jdk struct {
		dir     string
		version []int
	}
	var found []jdk
	seen := map[string]bool{}
	for _, e := range entries {
		dir, err := filepath.EvalSymlinks(filepath.Join(HostJVMDir, e.Name()))
		if err != nil || seen[dir] {
			continue
		}
		seen[dir] = true
		if fi, err := os.Stat(filepath.Join(dir, "bin", "java")); err != nil || fi.Mode()&0o111 == 0 {
			continue
		}
		v := javaVersion(filepath.Join(dir, "release"))
		if v == nil || (feature != 0 && v[0] != feature) {
			continue
		}
		found = append(found, jdk{dir, v})
	}
	if len(found) == 0 {
		what := "a JDK"
		if feature != 0 {
			what = "a JDK " + strconv.Itoa(feature)
		}
		return "", fmt.Errorf("no %s under %s (with a release file and bin/java)", what, HostJVMDir)
	}
	sort.Slice(found, func(i, j int) bool {
		a, b := found[i].version, found[j].version
		for k := 0; k < len(a) && k < len(b); k++ {
			if a[k] != b[k] {
				return a[k] > b[k]
			}
		}
		return len(a) > len(b)
	})
	return found[0].dir, nil
}

// javaVersion parses JAVA_VERSION from a JDK's release file into numbers,
// the feature version first ("1.8.0_402" gives [8 0 402]).
func javaVersion(release string) []int {
	f, err := os.Open(release)
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "JAVA_VERSION=")
		if !ok {
			continue
		}
		v = strings.Trim(v, `"`)
		v = strings.TrimPrefix(v, "1.") // 1.8.0_402
		var nums []int
		for _, p := range strings.FieldsFunc(v, func(r rune) bool { return r == '.' || r == '_' || r == '+' || r == '-' }) {
			n, err := strconv.Atoi(p)
			if err != nil {
				break
			}
			nums = append(nums, n)
		}
		if len(nums) == 0 {
			return nil
		}
		return nums
	}
	return nil
}
