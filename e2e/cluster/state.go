package cluster

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Snapshot is the part of the machine's state that a cluster run changes:
// recorded before Up, restored and compared after Down.
type Snapshot struct {
	// Sysctls: every writable entry under /proc/sys (but volatile ones), by
	// path relative to /proc/sys. The kubelet sets kernel.panic,
	// kernel.panic_on_oops and vm.overcommit_memory; the bridge plugin
	// net.ipv4.ip_forward; kube-proxy may set route_localnet and conntrack
	// limits.
	Sysctls map[string]string `json:"sysctls"`
	// Iptables: per "<save command>/<table>", the rules and chains as the
	// save command prints them, counters dropped.
	Iptables map[string][]string `json:"iptables"`
	// Paths: fixed paths the stack creates; nil if absent, else the names
	// in that directory (or [] for a file).
	Paths map[string][]string `json:"paths"`
	// Mounts: every mount point.
	Mounts []string `json:"mounts"`
	// Links: network interface names.
	Links []string `json:"links"`
	// Cgroups: per cgroup hierarchy mount point, its top-level directories.
	Cgroups map[string][]string `json:"cgroups"`
	// RunDir is the cluster's run dir (mounts under it are the cluster's).
	RunDir string `json:"runDir"`
}

// trackedPaths are the fixed paths the kubelet, containerd, the CNI plugins
// and the API server create whatever their configuration.
var trackedPaths = []string{
	"/var/lib/kubelet",
	"/var/log/containers",
	"/var/log/pods",
	"/run/containerd",
	"/run/netns",
	"/run/runc",
	"/var/lib/cni",
	"/etc/cni",
	"/opt/cni",
	"/opt/containerd",
	"/var/lib/containerd",
	"/etc/kubernetes",
	"/run/kubernetes",
}

// mountPrefixes are where the stack mounts (secret volumes, netns, shm,
// container root filesystems); new mounts under them are undone by Down.
// Mounts elsewhere are not the cluster's (the project's other tests may
// mount at the same time) and are neither undone nor compared.
func mountPrefixes(runDir string) []string {
	return []string{runDir, "/var/lib/kubelet", "/run/netns", "/var/run/netns", "/run/containerd", "/var/lib/cni"}
}

func (c *Cluster) mountPrefixes() []string { return mountPrefixes(c.runDir) }

func ourMount(m, runDir string) bool {
	for _, p := range mountPrefixes(runDir) {
		if p != "" && under(m, p) {
			return true
		}
	}
	return false
}

// volatileSysctls change on their own or cannot be restored.
var volatileSysctls = []string{
	"kernel/ns_last_pid",
	"kernel/random/",
	"kernel/tainted",
	"kernel/perf_event_max_sample_rate",
	"kernel/sched_domain/",
	"fs/binfmt_misc/",
	"vm/drop_caches",
	"net/ipv4/route/flush",
	"net/ipv6/route/flush",
	"net/ipv4/neigh/",
	"net/ipv6/neigh/",
	"net/netfilter/nf_conntrack_count",
	"fs/dentry-state",
	"dev/cdrom/",
}

// perInterface reports sysctls of one network interface (they come and go
// with the interface; those of "all", "default" and lo are kept).
func perInterface(key string) bool {
	for _, p := range []string{"net/ipv4/conf/", "net/ipv6/conf/", "net/mpls/conf/"} {
		if rest, ok := strings.CutPrefix(key, p); ok {
			iface, _, _ := strings.Cut(rest, "/")
			return iface != "all" && iface != "default" && iface != "lo"
		}
	}
	return false
}

func readSysctls() map[string]string {
	out := map[string]string{}
	filepath.WalkDir("/proc/sys", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		key := strings.TrimPrefix(path, "/proc/sys/")
		for _, v := range volatileSysctls {
			if key == v || (strings.HasSuffix(v, "/") && strings.HasPrefix(key+"/", v)) {
				if d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
		}
		if d.IsDir() || perInterface(key) {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Mode().Perm()&0o200 == 0 || info.Mode().Perm()&0o444 == 0 {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		out[key] = strings.TrimSpace(string(b))
		return nil
	})
	return out
}

// iptablesSaves are the save commands whose output is recorded: the nft
// backend that Debian's iptables uses, and the legacy one where present.
var iptablesSaves = []string{"iptables-save", "ip6tables-save", "iptables-legacy-save", "ip6tables-legacy-save"}

func readIptables() map[string][]string {
	out := map[string][]string{}
	for _, save := range iptablesSaves {
		if _, err := exec.LookPath(save); err != nil {
			continue
		}
		b, err := exec.Command(save).Output()
		if err != nil {
			continue
		}
		table := ""
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			switch {
			case line == "" || strings.HasPrefix(line, "#") || line == "COMMIT":
			case strings.HasPrefix(line, "*"):
				table = line[1:]
				out[save+"/"+table] = []string{}
			case strings.HasPrefix(line, ":"):
				// ":CHAIN POLICY [pkts:bytes]"
				f := strings.Fields(line)
				if len(f) >= 2 {
					line = f[0] + " " + f[1]
				}
				out[save+"/"+table] = append(out[save+"/"+table], line)
			default:
				out[save+"/"+table] = append(out[save+"/"+table], line)
			}
		}
	}
	return out
}

func readPaths() map[string][]string {
	out := map[string][]string{}
	for _, p := range trackedPaths {
		fi, err := os.Lstat(p)
		if err != nil {
			out[p] = nil
			continue
		}
		names := []string{}
		if fi.IsDir() {
			ents, _ := os.ReadDir(p)
			for _, e := range ents {
				names = append(names, e.Name())
			}
		}
		out[p] = names
	}
	return out
}

type mountInfo struct {
	point, fstype, source string
}

func readMountInfo() []mountInfo {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []mountInfo
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		// ... mount point is field 4; after " - " come fstype and source.
		i := 6
		for i < len(f) && f[i] != "-" {
			i++
		}
		if i+2 >= len(f) {
			continue
		}
		out = append(out, mountInfo{point: unescapeMount(f[4]), fstype: f[i+1], source: f[i+2]})
	}
	return out
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func readMounts() []string {
	var out []string
	for _, m := range readMountInfo() {
		out = append(out, m.point)
	}
	sort.Strings(out)
	return out
}

func readLinks() []string {
	ents, _ := os.ReadDir("/sys/class/net")
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// cgroupRoots are the mount points of every cgroup hierarchy (each v1
// controller, named hierarchies, the v2 one).
func cgroupRoots() []string {
	var out []string
	for _, m := range readMountInfo() {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			out = append(out, m.point)
		}
	}
	sort.Strings(out)
	return out
}

func readCgroups() map[string][]string {
	out := map[string][]string{}
	for _, root := range cgroupRoots() {
		ents, _ := os.ReadDir(root)
		names := []string{}
		for _, e := range ents {
			if e.IsDir() {
				names = append(names, e.Name())
			}
		}
		out[root] = names
	}
	return out
}

// TakeSnapshot records the machine's state.
func TakeSnapshot() *Snapshot {
	return &Snapshot{
		RunDir:   DefaultRunDir,
		Sysctls:  readSysctls(),
		Iptables: readIptables(),
		Paths:    readPaths(),
		Mounts:   readMounts(),
		Links:    readLinks(),
		Cgroups:  readCgroups(),
	}
}

func (s *Snapshot) save(path string) error {
	b, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func loadSnapshot(path string) (*Snapshot, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &s, nil
}

func setOf(l []string) map[string]bool {
	m := make(map[string]bool, len(l))
	for _, s := range l {
		m[s] = true
	}
	return m
}

// Diff lists how now differs from s (the state before): one line per
// difference, empty when the machine is as it was.
func (s *Snapshot) Diff(now *Snapshot) []string {
	var d []string
	keys := make([]string, 0, len(s.Sysctls))
	for k := range s.Sysctls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if v, ok := now.Sysctls[k]; ok && v != s.Sysctls[k] {
			d = append(d, fmt.Sprintf("sysctl %s: %q, was %q", strings.ReplaceAll(k, "/", "."), v, s.Sysctls[k]))
		}
	}
	for _, k := range sortedKeys(s.Iptables, now.Iptables) {
		before, after := setOf(s.Iptables[k]), setOf(now.Iptables[k])
		for _, l := range now.Iptables[k] {
			if !before[l] {
				d = append(d, fmt.Sprintf("%s: added %s", k, l))
			}
		}
		for _, l := range s.Iptables[k] {
			if !after[l] {
				d = append(d, fmt.Sprintf("%s: removed %s", k, l))
			}
		}
	}
	for _, p := range trackedPaths {
		b, a := s.Paths[p], now.Paths[p]
		switch {
		case b == nil && a != nil:
			d = append(d, fmt.Sprintf("path %s: created", p))
		case b != nil && a == nil:
			d = append(d, fmt.Sprintf("path %s: removed", p))
		case b != nil:
			bs := setOf(b)
			for _, n := range a {
				if !bs[n] {
					d = append(d, fmt.Sprintf("path %s/%s: created", p, n))
				}
			}
		}
	}
	bm, am := setOf(s.Mounts), setOf(now.Mounts)
	for _, m := range now.Mounts {
		if !bm[m] && ourMount(m, s.RunDir) {
			d = append(d, "mount "+m+": added")
		}
	}
	for _, m := range s.Mounts {
		if !am[m] && ourMount(m, s.RunDir) {
			d = append(d, "mount "+m+": gone")
		}
	}
	bl := setOf(s.Links)
	for _, l := range now.Links {
		// The bridge and pod veths are the cluster's; other interfaces
		// may come from the project's other tests.
		if !bl[l] && (l == bridgeName || strings.HasPrefix(l, "veth")) {
			d = append(d, "network interface "+l+": added")
		}
	}
	for _, root := range sortedKeys(s.Cgroups, now.Cgroups) {
		bc := setOf(s.Cgroups[root])
		for _, n := range now.Cgroups[root] {
			// cpuslot-* top-level cgroups belong to the project's other
			// tests (which may run at the same time); a cluster makes
			// none.
			if !bc[n] && !strings.HasPrefix(n, "cpuslot-") {
				d = append(d, fmt.Sprintf("cgroup %s/%s: added", root, n))
			}
		}
	}
	return d
}

func sortedKeys(ms ...map[string][]string) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range ms {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}
