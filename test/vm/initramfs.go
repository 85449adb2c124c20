package vm

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"sync"
	"time"
)

// newcWriter writes a cpio archive in the "newc" format, the one the kernel
// unpacks as an initramfs. Hand-written rather than imported because it is
// small and the kernel needs a device node (/dev/console), which generic cpio
// libraries do not write (no rdev fields).
type newcWriter struct {
	w     io.Writer
	ino   int
	dirs  map[string]bool
	err   error
	wrote int64
}

func newNewcWriter(w io.Writer) *newcWriter {
	return &newcWriter{w: w, dirs: map[string]bool{"": true, ".": true}}
}

const (
	modeDir     = 0o040000
	modeReg     = 0o100000
	modeSymlink = 0o120000
	modeChar    = 0o020000
)

func (c *newcWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.wrote += int64(n)
	c.err = err
}

func (c *newcWriter) pad() {
	if r := c.wrote % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// header writes one entry header; the caller then writes size bytes of data.
func (c *newcWriter) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) {
	c.ino++
	nlink := 1
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize, check
	h := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(h))
	c.write([]byte(name + "\x00"))
	c.pad()
}

// mkdirAll writes directory entries for dir and its missing parents: the
// kernel's unpacker does not create parents of a file by itself.
func (c *newcWriter) mkdirAll(dir string) {
	dir = strings.Trim(path.Clean("/"+dir), "/")
	if c.dirs[dir] {
		return
	}
	c.mkdirAll(path.Dir(dir))
	c.header(dir, modeDir|0o755, 0, 0, 0)
	c.dirs[dir] = true
}

func (c *newcWriter) file(name string, perm uint32, data []byte) {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	c.mkdirAll(path.Dir(name))
	c.header(name, modeReg|perm, int64(len(data)), 0, 0)
	c.write(data)
	c.pad()
}

// copyFile adds the host file src as name, keeping its permission bits.
func (c *newcWriter) copyFile(name, src string) {
	if c.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		c.err = err
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		c.err = err
		return
	}
	if !fi.Mode().IsRegular() {
		c.err = fmt.Errorf("%s is not a regular file", src)
		return
	}
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	c.mkdirAll(path.Dir(name))
	c.header(name, modeReg|uint32(fi.Mode().Perm())|0o444, fi.Size(), 0, 0)
	if c.err != nil {
		return
	}
	n, err := io.Copy(c.w, f)
	c.wrote += n
	if err == nil && n != fi.Size() {
		err = fmt.Errorf("%s changed size while being copied", src)
	}
	c.err = err
	c.pad()
}

func (c *newcWriter) symlink(name, target string) {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	c.mkdirAll(path.Dir(name))
	c.header(name, modeSymlink|0o777, int64(len(target)), 0, 0)
	c.write([]byte(target))
	c.pad()
}

func (c *newcWriter) charDev(name string, perm, major, minor uint32) {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	c.mkdirAll(path.Dir(name))
	c.header(name, modeChar|perm, 0, major, minor)
}

func (c *newcWriter) close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	return c.err
}

var (
	appletsOnce sync.Once
	applets     []string
	appletsErr  error
)

// busyboxApplets lists the applets of the static busybox as paths
// ("bin/sh", "sbin/poweroff", ...). The binary is static, so it runs on the
// host too; linking applets here saves `busybox --install` at every boot.
func busyboxApplets(busybox string) ([]string, error) {
	appletsOnce.Do(func() {
		out, err := exec.Command(busybox, "--list-full").Output()
		if err != nil {
			appletsErr = fmt.Errorf("listing busybox applets: %w", err)
			return
		}
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			if a := strings.TrimSpace(sc.Text()); a != "" {
				applets = append(applets, a)
			}
		}
	})
	return applets, appletsErr
}

// writeInitramfs writes to dst a gzip'd initramfs with busybox, /init,
// files (guest path -> host path) and symlinks (guest path -> target).
func writeInitramfs(dst string, busybox string, initScript string, files, symlinks map[string]string) error {
	list, err := busyboxApplets(busybox)
	if err != nil {
		return err
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	// BestSpeed: the archive is built for every boot and mostly holds Go
	// binaries; better ratios cost more host time than they save in the guest.
	zw, err := gzip.NewWriterLevel(bw, gzip.BestSpeed)
	if err != nil {
		return err
	}
	c := newNewcWriter(zw)
	for _, d := range []string{"dev", "proc", "sys", "tmp", "run", "root", "etc", "bin", "sbin", "usr/bin", "usr/sbin"} {
		c.mkdirAll(d)
	}
	// The kernel opens /dev/console for init's stdio before init can mount
	// devtmpfs.
	c.charDev("dev/console", 0o600, 5, 1)
	c.copyFile("bin/busybox", busybox)
	for _, a := range list {
		if a != "bin/busybox" {
			c.symlink(a, "/bin/busybox")
		}
	}
	// Enough for os/user and for tests that drop to nobody.
	c.file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"))
	c.file("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n"))
	c.file("init", 0o755, []byte(initScript))

	guestPaths := make([]string, 0, len(files))
	for g := range files {
		guestPaths = append(guestPaths, g)
	}
	sort.Strings(guestPaths)
	for _, g := range guestPaths {
		c.copyFile(g, files[g])
	}
	// Last, so that no file or directory can be written through a link.
	links := make([]string, 0, len(symlinks))
	for g := range symlinks {
		links = append(links, g)
	}
	sort.Strings(links)
	for _, g := range links {
		if _, err := cleanGuestPath(g); err != nil {
			return fmt.Errorf("vm: Options.Symlinks: %w", err)
		}
		name := strings.TrimPrefix(g, "/")
		_, isFile := files[g]
		if c.dirs[name] || isFile || isReserved(g) || name == "init" {
			return fmt.Errorf("vm: Options.Symlinks: %s is already a file or directory of the initramfs", g)
		}
		c.symlink(g, symlinks[g])
		c.dirs[name] = true // nothing else by that name
	}
	if err := c.close(); err != nil {
		return fmt.Errorf("writing initramfs: %w", err)
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellQuoteAll(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

// Console markers. Each run adds a random nonce, so neither the command's
// output nor a kernel message can fake them.
const (
	markerBegin = "@@CPUSLOT-VM-BEGIN:"
	markerEnd   = "@@CPUSLOT-VM-END:"
	markerFail  = "@@CPUSLOT-VM-SETUP-FAILED:"
	// markerWatchdog starts the guest watchdog's report: the command ran
	// past Options.Watchdog, and what follows is the guest's task states.
	markerWatchdog = "@@CPUSLOT-VM-WATCHDOG:"
	// markerHeartbeat is printed every heartbeatEvery while the command
	// runs: a guest whose kernel stops (interrupts off on every vCPU, so
	// not even the watchdog's sleep ends) stops printing it.
	markerHeartbeat = "@@CPUSLOT-VM-HEARTBEAT:"
)

// heartbeatEvery is the guest's heartbeat period, in seconds.
const heartbeatEvery = 5

// guestPATH is the command's PATH in the guest.
const guestPATH = "/bin:/sbin:/usr/bin:/usr/sbin"

// initScript returns /init for one run: modules are the guest paths of the
// modules to insmod, in order, and shares what to mount after them.
func initScript(opts Options, nonce string, modules []string, shares []share) string {
	mountOpts := ""
	if opts.MountOptions != "" {
		mountOpts = "-o " + shellQuote(opts.MountOptions) + " "
	}
	dir := opts.Dir
	if dir == "" {
		dir = "/"
	}
	env := append([]string{"PATH=" + guestPATH, "HOME=/root", "TMPDIR=/tmp"}, opts.Env...)

	var b strings.Builder
	fmt.Fprintf(&b, `#!/bin/sh
# /init generated by github.com/cpuslot/cpuslot/test/vm.
fail() {
	echo "%[1]s%[2]s $*@@"
	poweroff -f
	sleep 60
}
mount -t proc proc /proc || fail "mount proc"
mount -t sysfs sysfs /sys || fail "mount sysfs"
mount -t devtmpfs devtmpfs /dev || fail "mount devtmpfs"
mount -t tmpfs tmpfs /tmp || fail "mount /tmp"
mount -t tmpfs tmpfs /run || fail "mount /run"
mount -t cgroup2 %[3]scgroup2 /sys/fs/cgroup || fail "mount cgroup2"
echo "+cpu +cpuset +pids" >/sys/fs/cgroup/cgroup.subtree_control || fail "enable controllers"
`, markerFail, nonce, mountOpts)
	// Read-only host shares: busybox insmod (no modprobe, no modules.dep)
	// in dependency order, then one 9p mount per share.
	for _, m := range modules {
		fmt.Fprintf(&b, "insmod %[1]s || fail %[2]s\n", shellQuote(m), shellQuote("insmod "+path.Base(m)))
	}
	for _, s := range shares {
		g := shellQuote(s.guest)
		fmt.Fprintf(&b, "mkdir -p %[1]s && mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=%[2]d,cache=%[3]s %[4]s %[1]s || fail %[5]s\n",
			g, shareMsize, shareCache, s.tag, shellQuote("mount share "+s.guest))
	}
	if secs := int(opts.Watchdog.Round(time.Second) / time.Second); secs > 0 {
		// A hung guest says why before the host gives up on it: every
		// thread's state, kernel stack and wait channel, blocked tasks and
		// the CPUs' backtraces (sysrq w, l), then power off.
		fmt.Fprintf(&b, `echo 1 >/proc/sys/kernel/sysrq
(
	sleep %[1]d
	echo "%[2]s%[3]s after %[1]ds@@"
	echo 8 >/proc/sys/kernel/printk
	echo "uptime $(cat /proc/uptime) loadavg $(cat /proc/loadavg)"
	for p in /proc/[0-9]*; do
		[ -e $p/exe ] || continue # kernel threads: sysrq w below shows the blocked ones
		echo "pid ${p#/proc/}: $(tr '\0' ' ' <$p/cmdline 2>/dev/null)"
		for t in $p/task/*; do
			echo "pid ${p#/proc/} tid ${t##*/} $(cat $t/comm 2>/dev/null) $(grep -m1 State: $t/status 2>/dev/null) wchan=$(cat $t/wchan 2>/dev/null)"
			sed 's/^/    /' $t/stack 2>/dev/null
		done
	done
	echo w >/proc/sysrq-trigger
	echo l >/proc/sysrq-trigger
	sleep 2
	poweroff -f
) &
`, secs, markerWatchdog, nonce)
	}
	fmt.Fprintf(&b, "(while sleep %d; do echo \"%s%s@@\"; done) &\n", heartbeatEvery, markerHeartbeat, nonce)
	fmt.Fprintf(&b, `cd %[1]s || fail "cd %[1]s"
echo "%[2]s%[3]s@@"
env -i %[4]s %[5]s </dev/null
rc=$?
echo "%[6]s%[3]s exit=$rc@@"
poweroff -f
sleep 60
`, shellQuote(dir), markerBegin, nonce, shellQuoteAll(env), shellQuoteAll(opts.Command), markerEnd)
	return b.String()
}
