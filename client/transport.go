package client

// The connection pool: borrow a connection (one request in flight on it),
// make a call, give it back or close it.

import (
	"context"
	"errors"
	"fmt"
	"slices"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// call runs one request on a pooled connection. A broken connection (agent
// gone) triggers one reconnect, which re-declares held leases, and a retry.
func (c *Client) call(m slotv1.Message) (slotv1.Message, []int, *conn, error) {
	return c.callCtx(context.Background(), m)
}

// callCtx is call that returns ctx's error once ctx ends. A request already
// sent is left to abandon, which reads its answer off the caller's thread.
func (c *Client) callCtx(ctx context.Context, m slotv1.Message) (slotv1.Message, []int, *conn, error) {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, nil, nil, err
		}
		cn, err := c.get(ctx)
		if err != nil {
			return nil, nil, nil, err
		}
		resp, fds, err := cn.roundTripCtx(ctx, m)
		if err == nil {
			return c.answered(cn, resp, fds)
		}
		if errors.Is(err, errCancelled) {
			go c.abandon(cn, m)
			return nil, nil, nil, ctx.Err()
		}
		cn.close()
		if attempt > 0 {
			return nil, nil, nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
		}
		if rerr := c.recover(ctx, cn.gen); rerr != nil {
			if ctx.Err() != nil {
				return nil, nil, nil, ctx.Err()
			}
			if errors.Is(rerr, ErrUnreachable) {
				return nil, nil, nil, rerr
			}
			return nil, nil, nil, fmt.Errorf("%w: %w", ErrUnreachable, rerr)
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
	resp, fds, _, err = c.answered(cn, resp, fds)
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
		l = &Lease{c: c, id: ok.Lease, gen: cn.gen, cn: cn, Slot: ok.Slot, QuotaMilli: ok.QuotaMilli, tid: int(a.TID), action: a.Action, invocation: a.Invocation}
		c.held[l] = struct{}{}
	}); err == nil {
		_, _ = l.Release(slotv1.PlacementFailed)
	}
}

// answered gives back to the pool a connection that answered, and turns an
// ERROR answer into the error; with the connection the answer came on (its
// generation, and the connection a lease it grants belongs to).
func (c *Client) answered(cn *conn, resp slotv1.Message, fds []int) (slotv1.Message, []int, *conn, error) {
	c.put(cn)
	if e, ok := resp.(*slotv1.Error); ok {
		closeFDs(fds) // an error grants nothing: fds with it are a faulty agent's
		return nil, nil, cn, e
	}
	return resp, fds, cn, nil
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

// takeIdle takes cn out of the pool if it is idle there: then no request
// is in flight on it and the caller may make one.
func (c *Client) takeIdle(cn *conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k := slices.Index(c.idle, cn); k >= 0 {
		c.idle = slices.Delete(c.idle, k, k+1)
		return true
	}
	return false
}

// put gives cn back to the pool; a connection from before a reconnect is
// closed only when it hung up (a live one holds its leases).
func (c *Client) put(cn *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || cn.gen != c.gen && cn.gone() {
		cn.close()
		return
	}
	c.idle = append(c.idle, cn)
}
