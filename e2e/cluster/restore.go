package cluster

// Restoring the machine after a cluster run: mounts, links, cgroups,
// iptables rules, sysctls and paths the run made are undone, relative to
// the Snapshot taken before.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/cpuslot/cpuslot/internal/cgroup"
)

// restore undoes, relative to s, what a cluster run changes: mounts,
// network interfaces, cgroups, iptables chains, sysctls and fixed paths.
// Processes must be gone already. It returns what it could not undo.
func (c *Cluster) restore(s *Snapshot) []error {
	var errs []error
	errs = append(errs, c.unmountNew(s)...)
	errs = append(errs, c.removeNewLinks(s)...)
	errs = append(errs, removeNewCgroups(s)...)
	errs = append(errs, restoreIptables(s)...)
	errs = append(errs, restoreSysctls(s)...)
	errs = append(errs, c.removeNewPaths(s)...)
	return errs
}

func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, strings.TrimSuffix(prefix, "/")+"/")
}

func (c *Cluster) unmountNew(s *Snapshot) []error {
	before := setOf(s.Mounts)
	var errs []error
	for try := 0; try < 3; try++ {
		var todo []string
		for _, m := range readMounts() {
			if before[m] {
				continue
			}
			for _, p := range c.mountPrefixes() {
				if under(m, p) {
					todo = append(todo, m)
					break
				}
			}
		}
		if len(todo) == 0 {
			return nil
		}
		// Deepest first.
		sort.Slice(todo, func(i, j int) bool { return len(todo[i]) > len(todo[j]) })
		errs = errs[:0]
		for _, m := range todo {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	return errs
}

func (c *Cluster) removeNewLinks(s *Snapshot) []error {
	before := setOf(s.Links)
	var errs []error
	for _, l := range readLinks() {
		if before[l] {
			continue
		}
		// Ours: the bridge and the host ends of pod veths on it.
		master, _ := os.Readlink("/sys/class/net/" + l + "/master")
		if l != bridgeName && filepath.Base(master) != bridgeName && !strings.HasPrefix(l, "veth") {
			continue
		}
		if out, err := exec.Command("ip", "link", "delete", l).CombinedOutput(); err != nil {
			if _, serr := os.Stat("/sys/class/net/" + l); serr == nil {
				errs = append(errs, fmt.Errorf("ip link delete %s: %v: %s", l, err, bytes.TrimSpace(out)))
			}
		}
	}
	return errs
}

// ourCgroup reports the top-level cgroups a cluster creates.
func ourCgroup(name string) bool {
	return name == "kubepods" || name == "kubepods.slice"
}

func removeNewCgroups(s *Snapshot) []error {
	var errs []error
	for _, root := range cgroupRoots() {
		before := setOf(s.Cgroups[root])
		ents, _ := os.ReadDir(root)
		for _, e := range ents {
			if !e.IsDir() || before[e.Name()] || !ourCgroup(e.Name()) {
				continue
			}
			// Processes of pods this cluster ran may still run there.
			if err := cgroup.RemoveTree(root, filepath.Join(root, e.Name()), cgroup.TreeOptions{Kill: true, Wait: 15 * time.Second}); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// ourChain reports the iptables chains the kubelet, kube-proxy and the CNI
// plugins create.
func ourChain(name string) bool {
	return strings.HasPrefix(name, "KUBE-") || strings.HasPrefix(name, "CNI-")
}

func restoreIptables(s *Snapshot) []error {
	var errs []error
	now := readIptables()
	for key, lines := range now {
		save, table, _ := strings.Cut(key, "/")
		cmd := strings.Replace(save, "-save", "", 1)
		before := setOf(s.Iptables[key])
		// Rules first (those in built-in or foreign chains that jump to or
		// belong to ours), then our chains.
		var newChains []string
		for _, l := range lines {
			if before[l] {
				continue
			}
			if strings.HasPrefix(l, ":") {
				name := strings.Fields(l)[0][1:]
				if ourChain(name) {
					newChains = append(newChains, name)
				}
				continue
			}
			args, err := splitRule(l)
			if err != nil || len(args) < 2 || args[0] != "-A" {
				continue
			}
			if ourChain(args[1]) {
				continue // goes with the chain's flush
			}
			if !strings.Contains(l, "KUBE-") && !strings.Contains(l, "CNI-") {
				continue
			}
			args[0] = "-D"
			if out, err := exec.Command(cmd, append([]string{"-w", "-t", table}, args...)...).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s -t %s %s: %v: %s", cmd, table, strings.Join(args, " "), err, bytes.TrimSpace(out)))
			}
		}
		for _, ch := range newChains {
			exec.Command(cmd, "-w", "-t", table, "-F", ch).Run()
		}
		for _, ch := range newChains {
			if out, err := exec.Command(cmd, "-w", "-t", table, "-X", ch).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s -t %s -X %s: %v: %s", cmd, table, ch, err, bytes.TrimSpace(out)))
			}
		}
		if _, existed := s.Iptables[key]; !existed {
			if err := deleteEmptyNftTable(save, table); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// deleteEmptyNftTable deletes an nf_tables table that iptables-nft created
// for the cluster (it did not exist before) once it holds nothing but its
// built-in chains with policy ACCEPT: iptables has no command for that, nft
// has.
func deleteEmptyNftTable(save, table string) error {
	var family string
	switch save {
	case "iptables-save":
		family = "ip"
	case "ip6tables-save":
		family = "ip6"
	default:
		return nil // legacy tables belong to the kernel's modules
	}
	for _, l := range readIptables()[save+"/"+table] {
		f := strings.Fields(l)
		if !strings.HasPrefix(l, ":") || len(f) != 2 || f[1] != "ACCEPT" {
			return nil // in use: not ours to delete
		}
	}
	nft, err := lookPath("nft")
	if err != nil {
		return fmt.Errorf("nf_tables table %s %s was created by the cluster and is empty, but nft (package nftables) is missing to delete it", family, table)
	}
	if out, err := exec.Command(nft, "delete", "table", family, table).CombinedOutput(); err != nil {
		return fmt.Errorf("nft delete table %s %s: %v: %s", family, table, err, bytes.TrimSpace(out))
	}
	return nil
}

// splitRule splits an iptables-save rule line into arguments (double quotes
// group, backslash escapes the next character inside them).
func splitRule(l string) ([]string, error) {
	var args []string
	var cur strings.Builder
	inArg, inQuote := false, false
	for i := 0; i < len(l); i++ {
		ch := l[i]
		switch {
		case inQuote && ch == '\\' && i+1 < len(l):
			i++
			cur.WriteByte(l[i])
		case ch == '"':
			inQuote = !inQuote
			inArg = true
		case !inQuote && (ch == ' ' || ch == '\t'):
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteByte(ch)
			inArg = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unbalanced quotes in %q", l)
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args, nil
}

func restoreSysctls(s *Snapshot) []error {
	var errs []error
	now := readSysctls()
	keys := make([]string, 0, len(s.Sysctls))
	for k := range s.Sysctls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, ok := now[k]
		if !ok || v == s.Sysctls[k] {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(s.Sysctls[k]+"\n"), 0); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s to %q: %w", k, s.Sysctls[k], err))
		}
	}
	return errs
}

func (c *Cluster) removeNewPaths(s *Snapshot) []error {
	var errs []error
	for _, p := range trackedPaths {
		before, known := s.Paths[p]
		if !known {
			continue
		}
		if before == nil {
			if err := safeRemoveAll(p); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		bs := setOf(before)
		ents, _ := os.ReadDir(p)
		for _, e := range ents {
			if !bs[e.Name()] {
				if err := safeRemoveAll(filepath.Join(p, e.Name())); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errs
}

// safeRemoveAll removes a tree unless something is still mounted in it
// (os.RemoveAll would descend into the mount).
func safeRemoveAll(p string) error {
	if _, err := os.Lstat(p); err != nil {
		return nil
	}
	for _, m := range readMounts() {
		if under(m, p) {
			return fmt.Errorf("not removing %s: %s is still mounted", p, m)
		}
	}
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// ensureSharedMount makes dir (created if missing) a shared mount unless
// the mount it lies on already propagates (shared or slave). Kubernetes
// expects shared mount propagation on the host (systemd makes / shared);
// here / may be private, and then the runtime refuses HostToContainer
// mounts of paths below it ("is mounted on / but it is not a shared or
// slave mount"). A bind mount of dir onto itself, made rshared, gives the
// same propagation to what lies below dir only. Down unmounts it (it is a
// new mount under the run dir or /var/lib/kubelet).
func ensureSharedMount(dir string) (bool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	if propagates(dir) {
		return false, nil
	}
	if err := syscall.Mount(dir, dir, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return false, fmt.Errorf("bind mount %s: %w", dir, err)
	}
	if err := syscall.Mount("", dir, "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		syscall.Unmount(dir, syscall.MNT_DETACH)
		return false, fmt.Errorf("make %s rshared: %w", dir, err)
	}
	return true, nil
}

// propagates reports whether the mount holding path is shared or a slave.
func propagates(path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	best, opt := "", ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		mp := unescapeMount(f[4])
		if under(path, mp) && len(mp) >= len(best) {
			best = mp
			// optional fields: f[6] up to "-"
			opt = ""
			for _, o := range f[6:] {
				if o == "-" {
					break
				}
				opt += o + " "
			}
		}
	}
	return strings.Contains(opt, "shared:") || strings.Contains(opt, "master:")
}
