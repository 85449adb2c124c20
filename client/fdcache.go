package client

// The slot fd cache: placement and counter fds by slot, as the agent passed
// them, and the slot each thread placed itself in last.

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/cpuslot/cpuslot/counters"
)

// split divides a slot's cached fds into placement and counter fds as the
// agent announced in HELLO_OK.
func (c *Client) split(fds []int) (place, stat []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.splitLocked(fds)
}

func (c *Client) splitLocked(fds []int) (place, stat []int) {
	p, s := int(c.hello.PlaceFDs), int(c.hello.StatFDs)
	if p == 0 || len(fds) != p+s {
		return fds, nil // an agent that passes placement fds only
	}
	return fds[:p], fds[p:]
}

func (c *Client) setCurrent(tid int, slot uint32) {
	c.mu.Lock()
	if slot == 0 {
		delete(c.current, tid)
	} else {
		c.current[tid] = slot
	}
	c.mu.Unlock()
}

var zero = []byte("0")

// placeSelf moves the calling thread into a slot: one write per hierarchy.
func placeSelf(fds []int) error {
	if len(fds) == 0 {
		return errors.New("no fd cached for the slot")
	}
	for _, fd := range fds {
		if _, err := unix.Write(fd, zero); err != nil {
			return err
		}
	}
	return nil
}

func readCounters(stat []int) (counters.Usage, bool) {
	if len(stat) == 0 {
		return counters.Usage{}, false
	}
	acct := -1
	if len(stat) > 1 {
		acct = stat[1]
	}
	u, err := counters.Read(stat[0], acct)
	return u, err == nil
}

// cacheFDs replaces a slot's cached fds with ones just received (the
// agent only sends fds that are valid now). The caller holds c.mu.
func (c *Client) cacheFDs(slot uint32, fds []int) {
	if len(fds) > 0 {
		closeFDs(c.fds[slot])
		c.fds[slot] = fds
	}
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
