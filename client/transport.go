package client

// The connection pool: borrow a connection (one request in flight on it),
// make a call, give it back or close it.

import (
	"errors"
	"fmt"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// sendOneWay sends a request that gets no answer (USAGE, RELEASE with
// NO_REPLY) on a pooled connection; false if it could not.
func (c *Client) sendOneWay(m slotv1.Message) bool {
	cn, err := c.get()
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
	for attempt := 0; ; attempt++ {
		cn, err := c.get()
		if err != nil {
			return nil, nil, 0, err
		}
		resp, fds, err := cn.roundTrip(m)
		if err == nil {
			return c.answered(cn, resp, fds)
		}
		cn.close()
		if attempt > 0 {
			return nil, nil, 0, fmt.Errorf("cpuslot: agent unreachable: %w", err)
		}
		if rerr := c.recover(cn.gen); rerr != nil {
			return nil, nil, 0, fmt.Errorf("cpuslot: agent unreachable: %w", rerr)
		}
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

func (c *Client) get() (*conn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errors.New("cpuslot: client closed")
	}
	if n := len(c.idle); n > 0 {
		cn := c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		return cn, nil
	}
	c.mu.Unlock()
	return c.dial()
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
