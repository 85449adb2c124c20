package server

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// watchExit calls gone once the process that pidfd refers to has exited.
// The wait parks a goroutine in the runtime's poller (a pidfd becomes
// readable when its process exits), so a watched process costs a
// goroutine and a descriptor, never a thread. stop ends the watch and
// frees both; gone may still run if the exit raced with stop.
func watchExit(pidfd int, gone func()) (stop func(), err error) {
	fd, err := unix.FcntlInt(uintptr(pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	// Non-blocking, so that os.NewFile registers it with the poller. The
	// flag is shared with pidfd; a pidfd is only ever polled here.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	// Read waits for readability only after the check said no: an exit
	// before the wait began is seen by the check itself.
	check := func(fd uintptr) bool { return exited(int(fd)) }
	if check(uintptr(fd)) {
		f.Close()
		go gone()
		return func() {}, nil
	}
	go func() {
		if rc.Read(check) == nil {
			gone()
		}
	}()
	return func() { f.Close() }, nil
}

// exited reports whether the process of pidfd has exited (an error other
// than an interrupted poll counts as exited: nothing can be checked).
func exited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || n > 0
	}
}
