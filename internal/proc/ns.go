package proc

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// PIDNamespace returns the inode of process pid's PID namespace.
func PIDNamespace(pid int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", pid), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// nsGetParent is ioctl_ns(2)'s NS_GET_PARENT, _IO(0xb7, 0x2): a new fd of
// the parent of the PID namespace a fd refers to.
const nsGetParent = 0xb702

// maxNSDepth bounds the walk up a namespace's parents (the kernel nests
// PID namespaces at most 32 deep).
const maxNSDepth = 32

// InPIDNamespace reports whether process pid lives in PID namespace ns or
// in one below it, walking up its namespace's parents (NS_GET_PARENT). The
// walk ends at the agent's own namespace (EPERM above it) or the root.
func InPIDNamespace(pid int, ns uint64) (bool, error) {
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/pid", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	for depth := 0; ; depth++ {
		var st unix.Stat_t
		err := unix.Fstat(fd, &st)
		if err != nil || st.Ino == ns || depth >= maxNSDepth {
			unix.Close(fd)
			return err == nil && st.Ino == ns, err
		}
		parent, err := unix.IoctlRetInt(fd, nsGetParent)
		unix.Close(fd)
		if errors.Is(err, unix.EPERM) {
			return false, nil // no parent the agent can see: ns is not above it
		}
		if err != nil {
			return false, fmt.Errorf("NS_GET_PARENT: %w", err)
		}
		fd = parent
	}
}

// ioctl_ns(2): NS_GET_OWNER_UID, _IOR(0xb7, 0x4, uid_t).
const nsGetOwnerUID = 0xb704

// UserNS is a process's user namespace as the agent sees it.
type UserNS struct {
	Ino uint64
	// Parent is the parent namespace's inode (0: none the agent can see).
	Parent uint64
	// Owner is the user (in the agent's user namespace) that made it.
	Owner uint32
}

// UserNamespace reads process pid's user namespace.
func UserNamespace(pid int) (UserNS, error) {
	var u UserNS
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return u, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return u, err
	}
	u.Ino = st.Ino
	if u.Owner, err = unix.IoctlGetUint32(fd, nsGetOwnerUID); err != nil {
		return u, fmt.Errorf("NS_GET_OWNER_UID: %w", err)
	}
	parent, err := unix.IoctlRetInt(fd, nsGetParent)
	if errors.Is(err, unix.EPERM) {
		return u, nil // the agent's own, or above it
	}
	if err != nil {
		return u, fmt.Errorf("NS_GET_PARENT: %w", err)
	}
	defer unix.Close(parent)
	if err := unix.Fstat(parent, &st); err != nil {
		return u, err
	}
	u.Parent = st.Ino
	return u, nil
}
