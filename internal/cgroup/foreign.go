package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"
)

// On cgroup v1 a slot's placement fd moves any thread its holder can name
// into the slot: a container that passes its fds on lets another
// container's process run in its slot, under its limit and on its bill.
// The kernel checks nothing, so the agent looks: a thread belongs to a
// container when its cgroup in a witness hierarchy (a v1 hierarchy other
// than cpu and cpuacct, which no slot fd reaches, and in which container
// runtimes make the same path as in cpu) lies in the container's path.
// Nobody without write access to cgroupfs can change it. A foreign thread
// is moved back to its own cgroup. On v2 the kernel refuses such moves.

// Witness is a v1 hierarchy no slot fd reaches.
type Witness struct {
	// Key names it in /proc/<pid>/cgroup ("pids", "name=systemd").
	Key string `json:"key"`
	// Root is its mount point.
	Root string `json:"root"`
}

// witnessOrder ranks the witness hierarchies: controllers every container
// runtime joins first, the controller-less named one last.
var witnessOrder = []string{"pids", "memory", "devices", "freezer", "blkio", "cpuset", "hugetlb",
	"perf_event", "net_cls", "net_prio", "rdma", "misc", "name=systemd"}

// witnessesIn finds the witness hierarchies among v1 mounts of their root.
func witnessesIn(mounts []*mountinfo.Info) []Witness {
	found := map[string]string{}
	for _, m := range mounts {
		if m.FSType != "cgroup" || m.Root != "/" {
			continue
		}
		opts := strings.Split(m.VFSOptions, ",")
		if hasOpt(opts, "cpu") || hasOpt(opts, "cpuacct") {
			continue
		}
		for _, k := range witnessOrder {
			if hasOpt(opts, k) {
				if _, ok := found[k]; !ok {
					found[k] = m.Mountpoint
				}
				break
			}
		}
	}
	var out []Witness
	for _, k := range witnessOrder {
		if root, ok := found[k]; ok {
			out = append(out, Witness{Key: k, Root: root})
		}
	}
	return out
}

// witnessOf picks the first witness hierarchy in which the container's
// path exists: there its runtime put the container's processes.
func (h *Hierarchy) witnessOf(rel string) *Witness {
	for i, w := range h.Witnesses {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(w.Root, rel), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return &h.Witnesses[i]
		}
	}
	return nil
}

// Witness is the hierarchy that tells the container's threads from others
// (nil: none; v2, or no v1 hierarchy holds the container's path).
func (c *Container) Witness() *Witness { return c.witness }

// Foreign is a thread found in one of the container's slots whose process
// belongs elsewhere.
type Foreign struct {
	TID, PID int
	// Slot is the slot's directory name.
	Slot string
	// Home is the cgroup it belongs to: its witness path, or (no witness)
	// its process's cpu cgroup.
	Home string
	// MovedTo is the cpu cgroup it was moved back to ("" when not moved).
	MovedTo string
	// Err says why it was not moved.
	Err error
}

// Scan is one pass over a container's slots.
type Scan struct {
	Checked int // threads whose identity was read
	Threads int // threads in the container's slots
	Foreign []Foreign
}

// ErrNoHome means a foreign thread's own cgroup could not be found (no
// witness, and its process's leader sits in a slot too): it stays.
var ErrNoHome = errors.New("its own cgroup is not known")

// EvictForeign checks at most max threads of the container's slots (v1;
// nothing to do on v2) and moves every foreign one back to its own cgroup.
// Successive calls go on where the last one stopped, so a container with
// more threads than max is covered over several calls.
func (c *Container) EvictForeign(max int) (Scan, error) {
	if c.h.ConfinesFDs() || max <= 0 {
		return Scan{}, nil
	}
	names, err := c.subdirs(0)
	if err != nil {
		return Scan{}, c.gone(err)
	}
	sort.Strings(names)
	return c.evictForeign(names, max)
}

// EvictForeignIn is EvictForeign over slots ids only (those whose fds a
// client may hold): it reads nothing of the others.
func (c *Container) EvictForeignIn(ids []uint32, max int) (Scan, error) {
	if c.h.ConfinesFDs() || max <= 0 || len(ids) == 0 {
		return Scan{}, nil
	}
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = SlotName(id)
	}
	return c.evictForeign(names, max)
}

func (c *Container) evictForeign(names []string, max int) (Scan, error) {
	var sc Scan
	type entry struct {
		slot string
		tid  int
	}
	var all []entry
	for _, n := range names {
		if !isSlot(n) {
			continue
		}
		seen := map[int]bool{}
		// Every hierarchy: a holder may write one placement fd only (on
		// cpuacct apart: billed to the container, not limited).
		for i := range c.dirs {
			lines, err := c.linesAt(i, n+"/tasks")
			if err != nil {
				continue // removed meanwhile
			}
			for _, l := range lines {
				if t, err := strconv.Atoi(l); err == nil && t > 0 && !seen[t] {
					seen[t] = true
					all = append(all, entry{n, t})
				}
			}
		}
	}
	sc.Threads = len(all)
	if len(all) == 0 {
		return sc, nil
	}
	c.mu.Lock()
	from := c.scanNext % len(all)
	n := min(max, len(all))
	c.scanNext = from + n
	c.mu.Unlock()
	for k := 0; k < n; k++ {
		e := all[(from+k)%len(all)]
		sc.Checked++
		if f, ok := c.foreign(e.slot, e.tid); ok {
			sc.Foreign = append(sc.Foreign, f)
		}
	}
	return sc, nil
}

// foreign decides whether thread tid in slot belongs to another container,
// and if so moves it back.
func (c *Container) foreign(slot string, tid int) (Foreign, bool) {
	own, err := threadCgroups(tid)
	if err != nil {
		return Foreign{}, false // exited
	}
	return c.foreignIn(slot, tid, own)
}

// foreignIn is foreign for a thread whose cgroups (own) are read.
func (c *Container) foreignIn(slot string, tid int, own map[string]string) (Foreign, bool) {
	if c.h.ConfinesFDs() {
		return Foreign{}, false
	}
	f := Foreign{TID: tid, Slot: slot}
	if c.witness != nil {
		w, ok := own[c.witness.Key]
		if !ok || within(w, c.Path) {
			return Foreign{}, false
		}
		f.Home = w
	}
	f.PID = tgidOf(tid)
	leader, err := cgroups.ParseCgroupFile(fmt.Sprintf("/proc/%d/cgroup", f.PID))
	if err != nil {
		leader = nil // a leader gone: the witness path tells where to go
	}
	if c.witness == nil {
		// No witness: the process's leader tells. Weaker: a holder can
		// write the leader into the slot too (docs/security.md).
		if l := leader["cpu"]; l == "" || within(l, c.Path) {
			return Foreign{}, false
		}
		f.Home = leader["cpu"]
	}
	f.MovedTo, f.Err = c.sendHome(slot, tid, f.Home, own, leader)
	return f, true
}

// threadCgroups reads the cgroups of one thread, by hierarchy key.
func threadCgroups(tid int) (map[string]string, error) {
	return cgroupFile("/proc/" + strconv.Itoa(tid) + "/task/" + strconv.Itoa(tid) + "/cgroup")
}

// cgroupFile reads a /proc cgroup file, by hierarchy key. It is the
// scan's cost per thread and an accept's per peer, so it reads the file
// in one read where it can (a few hierarchies of short paths), without
// the poller, and parses it in place.
func cgroupFile(name string) (map[string]string, error) {
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(fd)
	var small [2048]byte
	buf := small[:0]
	for {
		if len(buf) == cap(buf) {
			if cap(buf) >= 1<<20 {
				return nil, fmt.Errorf("%s: longer than 1 MiB", name)
			}
			buf = append(buf, make([]byte, cap(buf))...)[:len(buf)]
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: name, Err: err}
		}
		if n == 0 {
			break
		}
		buf = buf[:len(buf)+n]
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(buf), "\n") {
		// id:controllers:path; the path may hold colons.
		_, rest, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		ctrls, p, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		for _, k := range strings.Split(ctrls, ",") {
			m[k] = p
		}
	}
	return m, nil
}

// OnForeign has f told of each foreign thread MoveOut moves elsewhere
// than the container (a slot removed or a lease ended with one in it).
func (c *Container) OnForeign(f func(Foreign)) {
	c.mu.Lock()
	c.onForeign = f
	c.mu.Unlock()
}

func (c *Container) report(f Foreign) {
	c.mu.Lock()
	fn := c.onForeign
	c.mu.Unlock()
	if fn != nil {
		fn(f)
	}
}

// sendHome moves a foreign thread out of the container's slot in every
// hierarchy it sits there: to its process leader's cgroup when that is no
// slot and not in this container, else to the nearest cgroup at or above
// its witness path other than the root, else to the container's cgroup.
func (c *Container) sendHome(slot string, tid int, witness string, own, leader map[string]string) (string, error) {
	keys := []string{"cpu"}
	if c.h.AcctRoot != "" {
		keys = append(keys, "cpuacct")
	}
	var moved string
	for i, key := range keys {
		root := c.h.CPURoot
		if i == 1 {
			root = c.h.AcctRoot
		}
		if own[key] != path.Join(c.Path, slot) {
			continue // not in the slot in this hierarchy
		}
		dest := leader[key]
		if dest == "" || hasSlot(dest) || within(dest, c.Path) {
			if c.witness == nil {
				return moved, fmt.Errorf("thread %d: %w", tid, ErrNoHome)
			}
			// The root holds no limit: a thread with no cgroup of its
			// own below it stays under the slot's container's limit.
			if dest = nearest(root, witness); dest == "/" {
				dest = c.Path
			}
		}
		// Read again just before the write: the reads above took a while,
		// and a TID that exited and was reused meanwhile is another thread.
		if now, err := threadCgroups(tid); err != nil || now[key] != path.Join(c.Path, slot) {
			continue
		}
		if err := moveUnder(root, dest, tid); err != nil {
			return moved, err
		}
		if i == 0 {
			moved = dest
		}
	}
	return moved, nil
}

// hasSlot reports whether a cgroup path runs through a slot.
func hasSlot(p string) bool {
	for _, n := range strings.Split(p, "/") {
		if isSlot(n) {
			return true
		}
	}
	return false
}

// nearest is the deepest cgroup at or above p that exists under root and
// runs through no slot: where the cgroup's processes are when the
// hierarchy has no cgroup of their own.
func nearest(root, p string) string {
	best := "/"
	cur := "/"
	for _, n := range strings.Split(strings.Trim(path.Clean(p), "/"), "/") {
		if n == "" || isSlot(n) {
			break
		}
		cur = path.Join(cur, n)
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(root, cur), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			break
		}
		best = cur
	}
	return best
}

// moveUnder writes tid to the tasks file of cgroup rel below the hierarchy
// mounted at root, resolving rel beneath root and following no link.
func moveUnder(root, rel string, tid int) error {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	name := strings.TrimPrefix(path.Join(rel, "tasks"), "/")
	fd, err := unix.Openat2(dir, name, &unix.OpenHow{
		Flags:   unix.O_WRONLY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return &os.PathError{Op: "open", Path: filepath.Join(root, name), Err: err}
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(strconv.Itoa(tid))); err != nil {
		return &os.PathError{Op: "write", Path: filepath.Join(root, name), Err: err}
	}
	return nil
}

// within reports whether cgroup path p is dir or below it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}
