package client

// Recovery after an agent restart: reconnect, then re-declare held leases
// (RECLAIM) on the new connection.

import (
	"context"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// checkAgent notices, off the invocation path, that the agent went away
// (idle connections hung up), and reconnects: a client whose invocations
// all hit held slots sends nothing else that would notice, and the new
// agent must learn which slots it holds (RECLAIM).
//
// It looks only while no reconnect is under way, and decides under the
// same lock: during one, down is set and the generation is the one that
// reconnect made, so a check that waited its turn would reconnect again
// and close the connections just made, with the leases re-declared or
// granted on them (a lease belongs to its connection).
//
// ctx ends its tries to reconnect.
func (c *Client) checkAgent(ctx context.Context) {
	if !c.recoverMu.TryLock() {
		return // a reconnect is under way; the next check looks again
	}
	defer c.recoverMu.Unlock()
	c.mu.Lock()
	gen, broken := c.gen, c.down
	fds := make([]unix.PollFd, len(c.idle))
	for i, cn := range c.idle {
		fds[i] = unix.PollFd{Fd: int32(cn.fd), Events: unix.POLLIN}
	}
	if len(fds) > 0 {
		// An idle connection has nothing to read: readable means hung up.
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			broken = true
		}
	}
	c.mu.Unlock()
	if c.local != nil && c.local.connGone() {
		broken = true
	}
	if broken {
		_ = c.recoverLocked(ctx, gen)
	}
}

// recover reconnects after connection generation gen failed, unless another
// caller already did, and re-declares held leases on the new connection.
// ctx ends its tries to reconnect.
func (c *Client) recover(ctx context.Context, gen uint64) error {
	c.recoverMu.Lock()
	defer c.recoverMu.Unlock()
	return c.recoverLocked(ctx, gen)
}

// recoverLocked is recover for a caller that holds recoverMu.
func (c *Client) recoverLocked(ctx context.Context, gen uint64) error {
	c.mu.Lock()
	if c.gen != gen {
		c.mu.Unlock()
		return nil // someone else reconnected meanwhile
	}
	// Only connections that hung up go: one still open is to a live
	// agent, and closing it would end the leases it holds (a lease
	// belongs to its connection), which a RECLAIM on a new connection
	// cannot take over while the agent has not seen the close.
	live := c.idle[:0]
	for _, cn := range c.idle {
		if cn.gone() {
			cn.close()
		} else {
			live = append(live, cn)
		}
	}
	c.idle = live
	c.gen++
	c.down = true // until the leases are re-declared
	c.mu.Unlock()

	deadline := time.Now().Add(c.opts.ReconnectFor)
	var cn *conn
	var err error
	for delay := 5 * time.Millisecond; ; delay = min(delay*2, 200*time.Millisecond) {
		if cn, err = c.dial(ctx); err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// A lease whose connection is open is still held there; one whose
	// connection closed ended with it, and is re-declared on the new one.
	c.mu.Lock()
	var held []*Lease
	for l := range c.held {
		if l.gen < c.gen && !l.lost {
			held = append(held, l)
		}
	}
	c.mu.Unlock()
	held = slices.DeleteFunc(held, func(l *Lease) bool {
		if l.cn.gone() {
			return false
		}
		c.mu.Lock()
		l.gen = cn.gen
		c.mu.Unlock()
		return true
	})
	for _, l := range held {
		resp, fds, err := cn.roundTrip(&slotv1.Reclaim{Slot: l.Slot, QuotaMilli: l.QuotaMilli, TID: uint32(l.tid), Action: l.action, Invocation: l.invocation})
		if err != nil {
			cn.close()
			return err
		}
		c.mu.Lock()
		if ok, isOK := resp.(*slotv1.AcquireOK); isOK {
			l.id, l.gen, l.cn = ok.Lease, cn.gen, cn
			c.cacheFDs(ok.Slot, fds)
		} else {
			l.lost = true
			closeFDs(fds)
		}
		c.mu.Unlock()
	}
	if c.local != nil {
		if err := c.local.recovered(); err != nil {
			cn.close()
			return err
		}
	}
	c.mu.Lock()
	c.down = false
	c.mu.Unlock()
	c.put(cn)
	return nil
}
