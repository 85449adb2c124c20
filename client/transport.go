package client

// The connection pool: borrow a connection (one request in flight on it),
// make a call, give it back or close it.

import (
	"context"
	"errors"
	"fmt"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// sendOneWay sends a request that gets no answer (USAGE, RELEASE with
// NO_REPLY) on a pooled connection; false if it could not.
func (c *Client) sendOneWay(m slotv1.Message) bool {
	cn, err := c.get(context.Background())
	if err != nil {
		return false
	}
	if err := cn.send(m); err != nil {
		cn.close()
		c.mu.Lock()
		c.down = true // the agent went away: checkAgent reconnects
		c.mu.Unlock()
		return false
	}
	c.put(cn)
	return true
}

// call runs one request on a pooled connection. A broken connection (agent
// gone) triggers one reconnect, which re-declares held leases, and a retry.
func (c *Client) call(m slotv1.Message) (slotv1.Message, []int, uint64, error) {
	return c.callCtx(context.Background(), m)
}

// callCtx is call that returns ctx's error once ctx ends. A request already
// sent is left to abandon, which reads its answer off the caller's thread.
func (c *Client) callCtx(ctx context.Context, m slotv1.Message) (slotv1.Message, []int, uint64, error) {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, nil, 0, err
		}
		cn, err := c.get(ctx)
		if err != nil {
			return nil, nil, 0, err
		}
		resp, fds, err := cn.roundTripCtx(ctx, m)
		if err == nil {
			return c.answered(cn, resp, fds)
		}
		if errors.Is(err, errCancelled) {
			go c.abandon(cn, m)
			return nil, nil, 0, ctx.Err()
		}
		cn.close()
		if attempt > 0 {
			return nil, nil, 0, fmt.Errorf("%w: %w", ErrUnreachable, err)
		}
		if rerr := c.recover(ctx, cn.gen); rerr != nil {
			if ctx.Err() != nil {
				return nil, nil, 0, ctx.Err()
			}
			if errors.Is(rerr, ErrUnreachable) {
				return nil, nil, 0, rerr
			}
			return nil, nil, 0, fmt.Errorf("%w: %w", ErrUnreachable, rerr)
		}
	}
}

// abandon reads the answer to request m, whose caller's context ended
// first, and releases the lease it may grant: the caller never learns of
// it, and the agent would keep it for the process until its last
// connection closes.
func (c *Client) abandon(cn *conn, m slotv1.Message) {
	resp, fds, err := cn.readAnswer(false)
	if err != nil {
		cn.close()
		return
	}
	resp, fds, gen, err := c.answered(cn, resp, fds)
	if err != nil {
		return
	}
	a, isAcquire := m.(*slotv1.Acquire)
	if !isAcquire {
		closeFDs(fds)
		return
	}
	var l *Lease
	if _, err := c.grant(resp, fds, func(ok *slotv1.AcquireOK) {
		l = &Lease{c: c, id: ok.Lease, gen: gen, Slot: ok.Slot, QuotaMilli: ok.QuotaMilli, tid: int(a.TID), action: a.Action, invocation: a.Invocation}
		c.held[l] = struct{}{}
	}); err == nil {
		_, _ = l.Release(slotv1.PlacementFailed)
	}
}

// answered gives back to the pool a connection that answered, and turns an
// ERROR answer into the error; with the generation the answer came in.
func (c *Client) answered(cn *conn, resp slotv1.Message, fds []int) (slotv1.Message, []int, uint64, error) {
	c.put(cn)
	if e, ok := resp.(*slotv1.Error); ok {
		closeFDs(fds) // an error grants nothing: fds with it are a faulty agent's
		return nil, nil, cn.gen, e
	}
	return resp, fds, cn.gen, nil
}

func (c *Client) get(ctx context.Context) (*conn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if n := len(c.idle); n > 0 {
		cn := c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		return cn, nil
	}
	c.mu.Unlock()
	return c.dial(ctx)
}

func (c *Client) put(cn *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || cn.gen != c.gen {
		cn.close()
		return
	}
	c.idle = append(c.idle, cn)
}
