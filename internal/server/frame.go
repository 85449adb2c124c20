package server

import (
	"errors"
	"io"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// Framing: reading requests and writing answers on a connection.

// readFrame returns the next frame's body. Framing errors are *slotv1.Error.
// Nothing longer than the longest request (the longest HELLO before the
// peer is known) is buffered.
func (c *conn) readFrame() ([]byte, error) {
	if err := c.fill(slotv1.HeaderLen); err != nil {
		return nil, err
	}
	n, err := slotv1.BodyLen(c.buf[:slotv1.HeaderLen])
	if err != nil {
		if errors.Is(err, slotv1.ErrTooLarge) {
			return nil, slotv1.Errorf(slotv1.CodeBadRequest, "%v", err)
		}
		return nil, err
	}
	limit := slotv1.MaxRequestLen
	if c.pool == nil {
		limit = slotv1.MaxHelloLen
	}
	if n > limit {
		return nil, slotv1.Errorf(slotv1.CodeBadRequest, "frame of %d bytes is longer than any request this agent accepts now (%d)", n, limit)
	}
	if err := c.fill(slotv1.HeaderLen + n); err != nil {
		return nil, err
	}
	body := make([]byte, n)
	copy(body, c.buf[slotv1.HeaderLen:slotv1.HeaderLen+n])
	c.buf = c.buf[:copy(c.buf, c.buf[slotv1.HeaderLen+n:])]
	return body, nil
}

// fill reads until at least n bytes are buffered. Once part of a frame is
// in, the rest must come within FrameTimeout (a deadline is set only when
// a frame spans reads: most arrive whole).
func (c *conn) fill(n int) error {
	if cap(c.buf) < n {
		nb := make([]byte, len(c.buf), n)
		copy(nb, c.buf)
		c.buf = nb
	}
	deadline := false
	for len(c.buf) < n {
		if len(c.buf) > 0 && !deadline && c.pool != nil {
			c.c.SetReadDeadline(time.Now().Add(c.srv.limits.FrameTimeout))
			deadline = true
		}
		m, err := c.c.Read(c.buf[len(c.buf):cap(c.buf)])
		c.buf = c.buf[:len(c.buf)+m]
		if err != nil {
			if len(c.buf) > 0 && errors.Is(err, io.EOF) {
				return slotv1.Errorf(slotv1.CodeBadRequest, "connection closed inside a frame")
			}
			return err
		}
	}
	if deadline {
		c.c.SetReadDeadline(time.Time{})
	}
	return nil
}

func (c *conn) send(request uint32, m slotv1.Message, fds []int) bool {
	if _, refused := m.(*slotv1.Error); refused {
		c.owesTurn.Store(true) // a refused request changed nothing
	}
	if c.session != nil && c.session.gone.Load() {
		return true // its process has exited: the rest of its frames are read unanswered
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	var err error
	c.out, err = slotv1.Append(c.out[:0], request, m)
	if err != nil {
		c.srv.log.Error("encoding response", "err", err)
		return false
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	// A peer that does not read its answers would block this write for
	// ever once the socket's buffers are full: writes get FrameTimeout.
	// The deadline is pushed out only when half of it is gone, so most
	// sends set none.
	if now := time.Now(); c.writeDeadline.Sub(now) < c.srv.limits.FrameTimeout/2 {
		c.writeDeadline = now.Add(c.srv.limits.FrameTimeout)
		c.c.SetWriteDeadline(c.writeDeadline)
	}
	_, _, err = c.c.WriteMsgUnix(c.out, oob, nil)
	return err == nil
}

func (c *conn) fail(request uint32, err error) bool {
	return c.send(request, wireError(err), nil)
}
