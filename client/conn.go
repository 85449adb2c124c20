package client

// One connection to the agent: connect and HELLO, framed requests, and the
// fds that arrive with answers (SCM_RIGHTS).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

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
	// pend are the fds received so far with the answer being read.
	pend []int
	// wake is an eventfd a cancelled context writes to (-1 until a call
	// with a cancellable context); timeout bounds each wait for an answer.
	wake    int
	timeout time.Duration
	// wmu orders writes: a lease's one-way frames go out on its connection
	// (sendBeside) while a request may be in flight on it; it also guards
	// fd against a close meanwhile.
	wmu    sync.Mutex
	beside []byte
}

// errCancelled: the caller's context ended while an answer was awaited.
// The answer is still to come on the connection (readAnswer continues).
var errCancelled = errors.New("cpuslot: call cancelled")

func (c *Client) dial(ctx context.Context) (*conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	tv := unix.NsecToTimeval(c.opts.Timeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: c.path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: connecting to %s: %w", ErrUnreachable, c.path, err)
	}
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	cn := &conn{fd: fd, gen: gen, buf: make([]byte, 0, 256), oob: make([]byte, unix.CmsgSpace(4*8)), wake: -1, timeout: c.opts.Timeout}
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
	resp, fds, err := cn.roundTripCtx(ctx, &slotv1.Hello{MinVersion: slotv1.Version, MaxVersion: slotv1.Version, Flags: flags, Client: name})
	closeFDs(fds)
	if err != nil {
		cn.close()
		if errors.Is(err, errCancelled) {
			return nil, ctx.Err()
		}
		return nil, err
	}
	switch h := resp.(type) {
	case *slotv1.HelloOK:
		c.mu.Lock()
		c.hello = *h
		c.mu.Unlock()
		c.localOn.Store(flags&slotv1.HelloLocal != 0 && h.Flags&slotv1.HelloOKLocal != 0 && h.Flags&slotv1.HelloOKAgentPlaces == 0)
		c.holdListOn.Store(c.localOn.Load() && h.Flags&slotv1.HelloOKHoldList != 0)
		return cn, nil
	case *slotv1.Error:
		cn.close()
		return nil, h
	}
	cn.close()
	return nil, fmt.Errorf("cpuslot: unexpected %T to HELLO", resp)
}

func (cn *conn) close() {
	cn.wmu.Lock()
	if cn.fd >= 0 {
		unix.Close(cn.fd)
		cn.fd = -1
	}
	cn.wmu.Unlock()
	if cn.wake >= 0 {
		unix.Close(cn.wake)
		cn.wake = -1
	}
	closeFDs(cn.pend)
	cn.pend = nil
}

// send writes one request.
func (cn *conn) send(m slotv1.Message) error {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	cn.req++
	var err error
	if cn.out, err = slotv1.Append(cn.out[:0], cn.req, m); err != nil {
		return err
	}
	return cn.write(cn.out)
}

// sendBeside writes one-way frame m (request 0) on cn whether or not a
// request is in flight on it: the agent takes one-way frames while an
// ACQUIRE waits (SPEC.md, "Transport"), so a lease's RELEASE, SLEEP or WAKE
// is never stuck behind an ACQUIRE that waits for the budget it frees.
func (cn *conn) sendBeside(m slotv1.Message) error {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	var err error
	if cn.beside, err = slotv1.Append(cn.beside[:0], 0, m); err != nil {
		return err
	}
	return cn.write(cn.beside)
}

// write writes b whole; the caller holds wmu.
func (cn *conn) write(b []byte) error {
	if cn.fd < 0 {
		return errConnClosed
	}
	for off := 0; off < len(b); {
		n, err := unix.Write(cn.fd, b[off:])
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

var errConnClosed = errors.New("cpuslot: connection closed")

// gone reports whether the agent closed cn (or cn was closed here): the
// leases it held are over.
func (cn *conn) gone() bool {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	if cn.fd < 0 {
		return true
	}
	fds := []unix.PollFd{{Fd: int32(cn.fd), Events: unix.POLLRDHUP}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
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
	cn.buf, cn.pend = cn.buf[:0], nil
	return cn.readAnswer(false)
}

// roundTripCtx is roundTrip that gives up waiting when ctx ends, with
// errCancelled; the caller checked ctx before. With a context that cannot
// end it is roundTrip: the blocking read stays on the calling thread.
func (cn *conn) roundTripCtx(ctx context.Context, m slotv1.Message) (slotv1.Message, []int, error) {
	if ctx.Done() == nil {
		return cn.roundTrip(m)
	}
	if cn.wake < 0 {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			return nil, nil, err
		}
		cn.wake = fd
	}
	if err := cn.send(m); err != nil {
		return nil, nil, err
	}
	cn.buf, cn.pend = cn.buf[:0], nil
	woken := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, _ = unix.Write(cn.wake, one[:])
		close(woken)
	})
	resp, fds, err := cn.readAnswer(true)
	if !stop() {
		<-woken
		var b [8]byte
		_, _ = unix.Read(cn.wake, b[:]) // reset for the next call
	}
	return resp, fds, err
}

// await waits until the connection is readable (nil), the wake eventfd is
// (errCancelled), or the timeout passes.
func (cn *conn) await() error {
	fds := []unix.PollFd{{Fd: int32(cn.fd), Events: unix.POLLIN}, {Fd: int32(cn.wake), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(cn.timeout.Milliseconds()))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return unix.EAGAIN // as a read past SO_RCVTIMEO
		case fds[0].Revents != 0:
			return nil // an answer that came with the cancel wins
		}
		return errCancelled
	}
}

// readAnswer reads one response frame with any fds, continuing from what
// was read of it already (cn.buf, cn.pend). With cancellable it returns
// errCancelled when the wake eventfd fires first, leaving the rest unread.
func (cn *conn) readAnswer(cancellable bool) (slotv1.Message, []int, error) {
	fail := func(err error) (slotv1.Message, []int, error) {
		closeFDs(cn.pend)
		cn.pend = nil
		return nil, nil, err
	}
	for {
		need := slotv1.HeaderLen
		if len(cn.buf) >= slotv1.HeaderLen {
			body, err := slotv1.BodyLen(cn.buf)
			if err != nil {
				return fail(err)
			}
			need += body
		}
		if len(cn.buf) == need {
			break
		}
		if cap(cn.buf) < need {
			nb := make([]byte, len(cn.buf), need)
			copy(nb, cn.buf)
			cn.buf = nb
		}
		if cancellable {
			if err := cn.await(); errors.Is(err, errCancelled) {
				return nil, nil, err
			} else if err != nil {
				return fail(err)
			}
		}
		n, oobn, err := cn.recv(cn.buf[len(cn.buf):need], cn.oob)
		if err != nil {
			return fail(err)
		}
		if n == 0 {
			return fail(errors.New("agent closed the connection"))
		}
		if oobn > 0 {
			cn.pend = append(cn.pend, parseRights(cn.oob[:oobn])...)
		}
		cn.buf = cn.buf[:len(cn.buf)+n]
	}
	fds := cn.pend
	cn.pend = nil
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
