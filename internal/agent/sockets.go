package agent

// A socket per served container in standalone mode (standalone.socketDir),
// as each pod has its own in Kubernetes: a container's runtime connects on
// a socket no outsider can reach, so no one else fills its accept queue.
//
// The operator makes, for each container, a directory in socketDir named
// after the container's cgroup path (url.PathEscape of the path without its
// leading "/": /cpuslot/rt is "cpuslot%2Frt") and gives the container that
// directory (a bind mount, as the kubelet mounts a pod's emptyDir); the
// agent makes agent.sock in it when it serves the container. socketDir
// itself is root's and closed to everyone else (0700), so only root and
// the container that has its directory mounted reach a socket in it.

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/internal/discover"
)

// containerSocketName is the socket's name in a container's directory.
const containerSocketName = "agent.sock"

// openSocketDir makes socketDir if it is missing and checks that it is
// the agent's and closed to everyone else: a directory others could
// search would let them reach every container's socket.
func openSocketDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("standalone.socketDir %q: must be an absolute path", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("standalone.socketDir: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("standalone.socketDir: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		return fmt.Errorf("standalone.socketDir %s: must be a directory of the agent's user, mode 0700 (it is mode %#o, owner %d): others could reach every container's socket", dir, st.Mode&0o7777, st.Uid)
	}
	return nil
}

// socketDirName is the name of the directory in socketDir that belongs
// to the container of cgroup path cg.
func socketDirName(cg string) string {
	return url.PathEscape(strings.TrimPrefix(cg, "/"))
}

// cgroupOfSocketDir is the cgroup path a directory in socketDir names, if
// name is the one socketDirName gives for it.
func cgroupOfSocketDir(name string) (string, bool) {
	p, err := url.PathUnescape(name)
	if err != nil || p == "" || socketDirName(p) != name {
		return "", false
	}
	return "/" + p, true
}

// containerSocket is the socket of the container of cgroup path cg: in
// its directory in socketDir, when the operator made one ("" otherwise,
// and without socketDir).
func (a *Agent) containerSocket(cg string) string {
	dir := a.cfg.Standalone.SocketDir
	if dir == "" {
		return ""
	}
	name := socketDirName(cg)
	if len(name) > 255 {
		return ""
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, name), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return ""
	}
	return filepath.Join(dir, name, containerSocketName)
}

// serveSocketDirs serves each container below a serveUnder cgroup whose
// directory is in socketDir and that has a process: its runtime waits
// for its socket, and would never connect on the shared one.
func (a *Agent) serveSocketDirs() {
	dir := a.cfg.Standalone.SocketDir
	if dir == "" || len(a.cfg.Standalone.ServeUnder) == 0 {
		return
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		a.log.Warn("reading standalone.socketDir", "dir", dir, "err", err)
		return
	}
	for _, e := range entries {
		cg, ok := cgroupOfSocketDir(e.Name())
		if !ok || !e.IsDir() || !a.underServeUnder(cg) {
			continue
		}
		a.mu.Lock()
		s, preparing := a.containers[cg], a.preparing[cg]
		a.mu.Unlock()
		if s != nil || preparing != nil {
			continue
		}
		c, err := a.hierarchy.Container(cg, a.metrics.CgroupOp)
		if err != nil {
			continue // no such cgroup (yet)
		}
		busy, err := c.Populated()
		c.Close()
		if err != nil || !busy {
			continue
		}
		var partial *discover.Partial
		if _, err := a.serve(discover.Container{Name: cg, CgroupPath: cg}, true); err != nil && !errors.As(err, &partial) {
			a.log.Warn("serving a container with a socket directory", "container", cg, "err", err)
		}
	}
}

// underServeUnder reports whether cgroup cg is below a serveUnder cgroup
// (a container there is served on first contact).
func (a *Agent) underServeUnder(cg string) bool {
	for _, root := range a.cfg.Standalone.ServeUnder {
		if within(cg, root) && cg != root {
			return true
		}
	}
	return false
}
