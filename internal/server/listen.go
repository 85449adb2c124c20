package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// ErrSocketPathTaken is returned when something other than a socket sits
// where a socket is to be made: the agent replaces a stale socket, never a
// file, directory or symlink someone planted there.
var ErrSocketPathTaken = errors.New("socket path is taken by something that is not a socket")

// Listener is a Unix socket listener that removes its file when closed.
type Listener struct {
	*net.UnixListener
	// raw is a duplicate of the socket, for accept: a net.UnixListener
	// gives no access to its descriptor with the poller's wait.
	raw *os.File
	// closed is set once Close has begun: accept reports net.ErrClosed.
	closed atomic.Bool
	dir    int // O_PATH descriptor of the socket's directory
	name   string
	path   string

	closeOnce sync.Once
	closeErr  error
}

// Close stops listening and removes the socket file, if a socket is still
// what sits there. Only the first call does: the directory fd's number may
// be another file's by a second call.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { l.closeErr = l.close() })
	return l.closeErr
}

func (l *Listener) close() error {
	l.closed.Store(true)
	l.raw.Close()
	err := l.UnixListener.Close()
	var st unix.Stat_t
	if unix.Fstatat(l.dir, l.name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK {
		if rerr := unix.Unlinkat(l.dir, l.name, 0); rerr != nil && err == nil {
			err = rerr
		}
	}
	unix.Close(l.dir)
	return err
}

// socketMode is what the socket file gets: everyone may connect (access is
// decided per peer, not by file mode).
const socketMode = 0o666

// Listen opens a Unix socket at path, replacing a stale socket. The
// directory may be writable by a pod (its emptyDir): nothing in it is
// followed or changed by path. The directory is opened once; the socket is
// bound by its bare name relative to it, with its mode set by the umask at
// bind (no chmod that a swapped-in symlink could redirect), and what was
// made is checked without following links. Anything but a socket at the
// name is ErrSocketPathTaken.
func Listen(path string) (*Listener, error) {
	i := strings.LastIndexByte(path, '/')
	dir, name := ".", path
	if i >= 0 {
		dir, name = path[:i], path[i+1:]
		if dir == "" {
			dir = "/"
		}
	}
	if name == "" || name == "." || name == ".." || len(name) >= maxSunPath {
		return nil, fmt.Errorf("socket path %q: bad file name", path)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", dir, err)
	}
	l, err := listenAt(dfd, name)
	if err != nil {
		unix.Close(dfd)
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	l.path = path
	return l, nil
}

// maxSunPath is the room for a socket path in sockaddr_un, NUL included.
const maxSunPath = 108

func listenAt(dfd int, name string) (*Listener, error) {
	var st unix.Stat_t
	switch err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK:
		if err := unix.Unlinkat(dfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, err
		}
	case err == nil:
		return nil, fmt.Errorf("%w (mode %#o)", ErrSocketPathTaken, st.Mode)
	case !errors.Is(err, unix.ENOENT):
		return nil, err
	}
	ln, err := bindIn(dfd, name)
	if err != nil {
		if errors.Is(err, unix.EADDRINUSE) {
			// Something appeared at the name between the check and bind.
			return nil, fmt.Errorf("%w: %v", ErrSocketPathTaken, err)
		}
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	raw, err := ln.File()
	if err != nil {
		ln.Close()
		return nil, err
	}
	l := &Listener{UnixListener: ln, raw: raw, dir: dfd, name: name}
	err = unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil && (st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Mode&0o7777 != socketMode || int(st.Uid) != os.Geteuid()) {
		err = fmt.Errorf("%w: after bind it is mode %#o, owner %d", ErrSocketPathTaken, st.Mode, st.Uid)
	}
	if err != nil {
		raw.Close()
		ln.Close()
		return nil, err
	}
	return l, nil
}

// bindIn binds name in directory dfd on a thread of its own: the thread
// leaves the process's shared filesystem context (CLONE_FS), changes into
// the directory and sets the umask that gives the socket its mode. The
// thread is never handed back to the Go scheduler; it exits with the
// goroutine.
func bindIn(dfd int, name string) (*net.UnixListener, error) {
	type result struct {
		ln  *net.UnixListener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its private cwd and umask
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			ch <- result{err: fmt.Errorf("unshare(CLONE_FS): %w", err)}
			return
		}
		if err := unix.Fchdir(dfd); err != nil {
			ch <- result{err: err}
			return
		}
		unix.Umask(0o777 &^ socketMode)
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
		ch <- result{ln, err}
	}()
	r := <-ch
	return r.ln, r.err
}

// accept takes the next connection off the socket's queue as a bare
// descriptor (blocking, close-on-exec), waiting in the poller only while
// the queue is empty: a connection closed at accept never enters the
// poller (no registration, no finalizer), which is most of what a churned
// connection would cost. After Close it fails with net.ErrClosed.
func (l *Listener) accept() (int, error) {
	rc, err := l.raw.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, aerr := -1, error(nil)
	err = rc.Read(func(lfd uintptr) bool {
		for {
			fd, _, aerr = unix.Accept4(int(lfd), unix.SOCK_CLOEXEC)
			// A connection reset in the queue is skipped, as net does.
			if aerr != unix.EINTR && aerr != unix.ECONNABORTED {
				return aerr != unix.EAGAIN
			}
		}
	})
	if err != nil {
		if l.closed.Load() {
			return -1, net.ErrClosed
		}
		return -1, err
	}
	return fd, aerr
}

// hungUp reports whether the peer of connection fd has closed it having
// sent nothing: nothing it could ask can be answered.
func hungUp(fd int) bool {
	var b [1]byte
	n, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	if err != nil {
		return err != unix.EAGAIN && err != unix.EINTR
	}
	return n == 0
}

// unixConn makes connection fd a net.UnixConn in the poller; fd itself is
// closed (the conn holds a duplicate).
func unixConn(fd int) (*net.UnixConn, error) {
	f := os.NewFile(uintptr(fd), "")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("accepted a %T, not a Unix connection", c)
	}
	return uc, nil
}

// acceptBackoff spaces out accept retries after failures (out of fds or
// memory): 5ms doubling to 1s, and reports at most one failure per
// reportEvery, so a failing accept neither spins nor floods the log.
type acceptBackoff struct {
	wait     time.Duration
	failures int
	reported time.Time
}

const reportEvery = 10 * time.Second

func (b *acceptBackoff) failed(now time.Time) (wait time.Duration, report bool, failures int) {
	b.failures++
	b.wait = min(max(2*b.wait, 5*time.Millisecond), time.Second)
	if now.Sub(b.reported) >= reportEvery {
		b.reported = now
		report = true
	}
	return b.wait, report, b.failures
}

func (b *acceptBackoff) reset() { b.wait, b.failures = 0, 0 }
