package client

// One connection to the agent: connect and HELLO, framed requests, and the
// fds that arrive with answers (SCM_RIGHTS).

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// conn is one blocking connection. Blocking syscalls let a locked OS thread
// sleep in the kernel and wake directly when the answer arrives.
type conn struct {
	fd  int
	gen uint64
	req uint32
	out []byte
	buf []byte
	oob []byte
}

func (c *Client) dial() (*conn, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	tv := unix.NsecToTimeval(c.opts.Timeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: c.path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("cpuslot: connecting to %s: %w", c.path, err)
	}
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	cn := &conn{fd: fd, gen: gen, buf: make([]byte, 0, 256), oob: make([]byte, unix.CmsgSpace(4*8))}
	flags := uint32(slotv1.HelloFDPassing)
	if !c.opts.NoLocal {
		flags |= slotv1.HelloLocal
	}
	if c.opts.AgentPlaces {
		flags = 0
	}
	name := c.opts.Name
	if name == "" {
		name = "go:" + os.Args[0]
		if len(name) > 128 {
			name = name[:128]
		}
	}
	resp, fds, err := cn.roundTrip(&slotv1.Hello{MinVersion: slotv1.Version, MaxVersion: slotv1.Version, Flags: flags, Client: name})
	closeFDs(fds)
	if err != nil {
		cn.close()
		return nil, err
	}
	switch h := resp.(type) {
	case *slotv1.HelloOK:
		c.mu.Lock()
		c.hello = *h
		c.mu.Unlock()
		c.localOn.Store(flags&slotv1.HelloLocal != 0 && h.Flags&slotv1.HelloOKLocal != 0 && h.Flags&slotv1.HelloOKAgentPlaces == 0)
		c.heldOn.Store(c.localOn.Load() && h.Flags&slotv1.HelloOKHeld != 0)
		return cn, nil
	case *slotv1.Error:
		cn.close()
		return nil, h
	}
	cn.close()
	return nil, fmt.Errorf("cpuslot: unexpected %T to HELLO", resp)
}

func (cn *conn) close() {
	if cn.fd >= 0 {
		unix.Close(cn.fd)
		cn.fd = -1
	}
}

// send writes one request.
func (cn *conn) send(m slotv1.Message) error {
	cn.req++
	var err error
	if cn.out, err = slotv1.Append(cn.out[:0], cn.req, m); err != nil {
		return err
	}
	for off := 0; off < len(cn.out); {
		n, err := unix.Write(cn.fd, cn.out[off:])
		if err == unix.EINTR {
			continue // a signal (Go's preemption) interrupted the write
		}
		if err != nil {
			return err
		}
		off += n
	}
	return nil
}

// recv reads into p, retrying reads that a signal interrupted: with
// SO_RCVTIMEO set the kernel does not restart them, and Go's scheduler
// signals threads to preempt them.
func (cn *conn) recv(p, oob []byte) (n, oobn int, err error) {
	for {
		n, oobn, _, _, err = unix.Recvmsg(cn.fd, p, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			return n, oobn, err
		}
	}
}

// roundTrip sends one request and reads its response with any fds.
func (cn *conn) roundTrip(m slotv1.Message) (slotv1.Message, []int, error) {
	if err := cn.send(m); err != nil {
		return nil, nil, err
	}
	var fds []int
	cn.buf = cn.buf[:0]
	need := slotv1.HeaderLen
	for len(cn.buf) < need {
		if cap(cn.buf) < need {
			nb := make([]byte, len(cn.buf), need)
			copy(nb, cn.buf)
			cn.buf = nb
		}
		n, oobn, err := cn.recv(cn.buf[len(cn.buf):need], cn.oob)
		if err != nil {
			closeFDs(fds)
			return nil, nil, err
		}
		if n == 0 {
			closeFDs(fds)
			return nil, nil, errors.New("agent closed the connection")
		}
		if oobn > 0 {
			fds = append(fds, parseRights(cn.oob[:oobn])...)
		}
		cn.buf = cn.buf[:len(cn.buf)+n]
		if len(cn.buf) == slotv1.HeaderLen && need == slotv1.HeaderLen {
			body, err := slotv1.BodyLen(cn.buf)
			if err != nil {
				closeFDs(fds)
				return nil, nil, err
			}
			need += body
		}
	}
	f, err := slotv1.DecodeBody(cn.buf[slotv1.HeaderLen:])
	if err != nil {
		closeFDs(fds)
		return nil, nil, err
	}
	if f.Request != cn.req && f.Request != 0 {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("response to request %d, expected %d", f.Request, cn.req)
	}
	return f.Msg, fds, nil
}

func parseRights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if r, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}
