package client

// Lingering (Options.Linger): a lease outlives its invocation for the
// thread's next invocation of the same action and quota.

import (
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// expireParked releases lingering leases nobody reused in time.
func (c *Client) expireParked() {
	t := time.NewTicker(max(c.opts.Linger/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.mu.Lock()
			var old []*Lease
			for tid, l := range c.parked {
				if now.Sub(l.parkedAt) >= c.opts.Linger {
					old = append(old, l)
					delete(c.parked, tid)
				}
			}
			c.mu.Unlock()
			for _, l := range old {
				l.releaseParked()
			}
		}
	}
}

// releaseParked tells the agent a lingering lease is over.
func (l *Lease) releaseParked() {
	if _, ok := l.releaseOneWay(slotv1.InvocationOK); !ok {
		_, _ = l.releaseWithReply(slotv1.InvocationOK)
	}
}

// park keeps the lease for the thread's next invocation: it measures this
// invocation's usage and starts the next one's from here.
func (l *Lease) park() (Usage, bool) {
	c := l.c
	c.mu.Lock()
	fds := c.fds[l.Slot]
	c.mu.Unlock()
	_, stat := c.split(fds)
	end, ok := readCounters(stat)
	if !ok {
		return Usage{}, false
	}
	d := end.Sub(l.start)
	l.start, l.parkedAt = end, time.Now()
	c.mu.Lock()
	c.parked[l.tid] = l
	c.mu.Unlock()
	return usageOf(d), true
}
