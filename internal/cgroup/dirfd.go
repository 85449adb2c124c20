package cgroup

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A container holds one directory fd per hierarchy and reaches its files and
// slots relative to it, never by path. The fd pins the cgroup the agent
// prepared: a cgroup removed and made again at the same path is another
// directory, and every operation on the old one fails (ENOENT, ENODEV)
// instead of touching the new one. Slots keep fds open only within a
// node-wide budget (slot.go): a node of 250 containers x 64 slots needs
// 250-500 fds plus that budget, not 64,000.

// Identity tells cgroup directories apart: the same path may name another
// cgroup after a remove and a mkdir.
type Identity struct {
	Dev, Ino uint64
}

func identityOf(st *unix.Stat_t) Identity { return Identity{Dev: uint64(st.Dev), Ino: st.Ino} }

// IdentityOf returns the identity of the cgroup at rel (in the cpu
// hierarchy).
func (h *Hierarchy) IdentityOf(rel string) (Identity, error) {
	var st unix.Stat_t
	if err := unix.Stat(h.dirs(rel)[0], &st); err != nil {
		return Identity{}, err
	}
	return identityOf(&st), nil
}

// ErrGone means the container's cgroup was removed (perhaps made again at
// the same path): its pool is stale.
var ErrGone = errors.New("container cgroup is gone")

// gone classifies an error of an operation relative to the container: the
// kernel answers ENODEV for a file of a removed cgroup and ENOENT for a
// lookup in a removed directory.
func (c *Container) gone(err error) error {
	if err == nil || errors.Is(err, ErrGone) {
		return err
	}
	if errors.Is(err, syscall.ENODEV) || (errors.Is(err, syscall.ENOENT) && !c.Exists()) {
		return fmt.Errorf("%w: %w", ErrGone, err)
	}
	return err
}

const openFlags = unix.O_CLOEXEC | unix.O_NOFOLLOW

var errClosed = fmt.Errorf("%w: the agent stopped serving it", ErrGone)

func (c *Container) openAt(i int, rel string, flags int) (int, error) {
	c.fdMu.RLock()
	defer c.fdMu.RUnlock()
	if i >= len(c.fds) {
		return -1, errClosed
	}
	for {
		fd, err := unix.Openat(c.fds[i], rel, flags|openFlags, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: c.dirs[i] + "/" + rel, Err: err}
		}
		return fd, nil
	}
}

func (c *Container) readAt(i int, rel string) ([]byte, error) {
	fd, err := c.openAt(i, rel, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), c.dirs[i]+"/"+rel)
	defer f.Close()
	return io.ReadAll(f)
}

func (c *Container) writeAt(i int, rel, value string) error {
	fd, err := c.openAt(i, rel, unix.O_WRONLY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(value)); err != nil {
		return &os.PathError{Op: "write", Path: c.dirs[i] + "/" + rel, Err: err}
	}
	return nil
}

func (c *Container) linesAt(i int, rel string) ([]string, error) {
	b, err := c.readAt(i, rel)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

func (c *Container) mkdirAt(i int, rel string) error {
	c.fdMu.RLock()
	defer c.fdMu.RUnlock()
	if i >= len(c.fds) {
		return errClosed
	}
	if err := unix.Mkdirat(c.fds[i], rel, 0o755); err != nil {
		return &os.PathError{Op: "mkdir", Path: c.dirs[i] + "/" + rel, Err: err}
	}
	return nil
}

func (c *Container) rmdirAt(i int, rel string) error {
	c.fdMu.RLock()
	defer c.fdMu.RUnlock()
	if i >= len(c.fds) {
		return errClosed
	}
	if err := unix.Unlinkat(c.fds[i], rel, unix.AT_REMOVEDIR); err != nil {
		return &os.PathError{Op: "rmdir", Path: c.dirs[i] + "/" + rel, Err: err}
	}
	return nil
}

// subdirs lists the names of the directories in the container's cgroup of
// hierarchy i.
func (c *Container) subdirs(i int) ([]string, error) { return c.subdirsOf(i, ".") }

func (c *Container) subdirsOf(i int, rel string) ([]string, error) {
	fd, err := c.openAt(i, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), c.dirs[i])
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// Close releases the container's directory fds. Slots made from it must
// not be used afterwards.
func (c *Container) Close() {
	c.fdMu.Lock()
	defer c.fdMu.Unlock()
	for _, fd := range c.fds {
		unix.Close(fd)
	}
	c.fds = nil
}

// Identity is the identity of the container's cgroup (cpu hierarchy).
func (c *Container) Identity() Identity { return c.id }
