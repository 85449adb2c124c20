package client

// Leases through the agent: ACQUIRE places the thread, RELEASE (one-way
// when the client can read the slot's counters itself) ends the lease.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/counters"
)

// Usage is what a lease's slot used while held.
type Usage struct {
	CPU              time.Duration
	Throttled        time.Duration
	Periods          uint64
	ThrottledPeriods uint64
}

// Lease is a granted slot.
type Lease struct {
	c   *Client
	id  uint64
	gen uint64
	// cn is the connection that holds the lease: every frame naming it
	// goes there (SPEC.md, "Lifetimes").
	cn         *conn
	Slot       uint32
	QuotaMilli uint32
	Outcome    slotv1.Outcome
	Place      slotv1.Place
	Queued     bool
	Degraded   bool
	tid        int
	action     string
	invocation string
	// lost means the lease could not be re-declared after a reconnect.
	lost bool
	// start holds the slot's counters read right after placement, when the
	// client has the slot's counter fds; then Release needs no reply.
	start    counters.Usage
	hasStart bool
	parkedAt time.Time
	// Reused reports that the lease lingered from the thread's previous
	// invocation: no message went to the agent.
	Reused bool
	// Local reports a slot the process holds (local leasing): the
	// acquisition sent nothing to the agent unless it was a miss.
	Local    bool
	claim    slotv1.Claim
	stat     []int // the slot's counter fds (local leases)
	released atomic.Bool
	// sleeping: the agent took a SLEEP and no WAKE since.
	sleeping atomic.Bool
}

// Acquire leases a slot of quotaMilli for an invocation and places the
// calling OS thread in it: AcquireContext with a context that never ends
// (it may wait for the agent's wait budget, Options.Wait).
func (c *Client) Acquire(quotaMilli uint32, action, invocation string) (*Lease, error) {
	return c.AcquireContext(context.Background(), quotaMilli, action, invocation)
}

// AcquireContext is Acquire that returns ctx's error once ctx ends, also
// while it waits for a slot. A deadline caps the wait budget sent to the
// agent. A grant that arrives after the end is released.
func (c *Client) AcquireContext(ctx context.Context, quotaMilli uint32, action, invocation string) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	tid := unix.Gettid()
	if c.local != nil && (c.localOn.Load() || c.opts.TableFile != nil) {
		l, err := c.local.acquire(ctx, tid, quotaMilli, action)
		if !errors.Is(err, slotv1.ErrTableFull) && !errors.Is(err, errNoLocal) {
			return l, err
		}
	}
	c.mu.Lock()
	cur := c.current[tid]
	p := c.parked[tid]
	delete(c.parked, tid)
	reuse := p != nil && p.QuotaMilli == quotaMilli && !p.Degraded && p.action == action && p.gen == c.gen
	c.mu.Unlock()
	if reuse {
		p.invocation, p.Reused, p.Outcome, p.Place, p.Queued = invocation, true, slotv1.OutcomeAffinityHit, slotv1.PlaceNone, false
		return p, nil
	}
	if p != nil {
		p.releaseParked() // another action or quota: end it first
	}
	wait := c.opts.Wait
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); wait <= 0 || left < wait {
			wait = max(left, time.Microsecond) // 0 would mean the agent's default
		}
	}
	req := &slotv1.Acquire{QuotaMilli: quotaMilli, TID: uint32(tid), CurrentSlot: cur, Action: action, Invocation: invocation,
		WaitUS: uint32(min(wait.Microseconds(), 1<<32-1))}
	if c.opts.AgentPlaces {
		req.Flags |= slotv1.AcquireAgentPlaces
	}
	resp, fds, cn, err := c.callCtx(ctx, req)
	if err != nil {
		return nil, err
	}
	var l *Lease
	var slotFDs []int
	ok, err := c.grant(resp, fds, func(ok *slotv1.AcquireOK) {
		l = &Lease{c: c, id: ok.Lease, gen: cn.gen, cn: cn, Slot: ok.Slot, QuotaMilli: ok.QuotaMilli, Outcome: ok.Outcome, Place: ok.Place,
			Queued: ok.Flags&slotv1.AcquiredQueued != 0, Degraded: ok.Flags&slotv1.AcquiredDegraded != 0,
			tid: tid, action: action, invocation: invocation}
		slotFDs = c.fds[ok.Slot]
		c.held[l] = struct{}{}
	})
	if err != nil {
		return nil, err
	}

	place, stat := c.split(slotFDs)
	if ok.Place == slotv1.PlaceSelf {
		if err := placeSelf(place); err != nil {
			c.setCurrent(tid, 0)
			_, _ = l.Release(slotv1.PlacementFailed)
			return nil, fmt.Errorf("cpuslot: placing thread in slot %d: %w", ok.Slot, err)
		}
	}
	c.setCurrent(tid, ok.Slot)
	l.start, l.hasStart = readCounters(stat)
	return l, nil
}

// grant turns the agent's answer to an ACQUIRE, on either path, into the
// grant, with the fds that came along cached for its slot; any other
// answer is an error and its fds are closed. keep records the caller's
// lease under the same hold of c.mu as the cache, so that a reconnect
// sees both or neither.
func (c *Client) grant(resp slotv1.Message, fds []int, keep func(ok *slotv1.AcquireOK)) (*slotv1.AcquireOK, error) {
	ok, isOK := resp.(*slotv1.AcquireOK)
	if !isOK {
		closeFDs(fds)
		return nil, fmt.Errorf("cpuslot: unexpected %T to ACQUIRE", resp)
	}
	c.mu.Lock()
	c.cacheFDs(ok.Slot, fds)
	keep(ok)
	c.mu.Unlock()
	return ok, nil
}

// Release ends the lease and returns what the slot used meanwhile. The
// thread stays in the slot: the next invocation on it reuses the slot with
// no cgroup write.
func (l *Lease) Release(outcome slotv1.ReleaseOutcome) (Usage, error) {
	c := l.c
	if l.Local {
		return c.local.release(l, outcome)
	}
	if c.opts.Linger > 0 && l.hasStart && outcome == slotv1.InvocationOK {
		if u, ok := l.park(); ok {
			return u, nil
		}
	}
	if l.hasStart && outcome != slotv1.PlacementFailed {
		if u, ok := l.releaseOneWay(outcome); ok {
			return u, nil
		}
	}
	return l.releaseWithReply(outcome)
}

func usageOf(d counters.Usage) Usage {
	return Usage{CPU: time.Duration(d.CPUNanos), Throttled: time.Duration(d.ThrottledNanos), Periods: d.Periods, ThrottledPeriods: d.ThrottledPeriods}
}

// releaseWithReply sends RELEASE on the lease's connection and waits for
// the agent's usage. When a request is in flight there (an ACQUIRE that
// may wait for the budget this lease holds) it goes one-way beside it
// instead, and the usage is unknown (zero).
func (l *Lease) releaseWithReply(outcome slotv1.ReleaseOutcome) (Usage, error) {
	c := l.c
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		id, lost, cn := l.id, l.lost, l.cn
		c.mu.Unlock()
		if lost {
			c.forget(l)
			return Usage{}, ErrLeaseLost
		}
		if cn.gone() {
			// Its connection closed, and the lease with it, unless a
			// reconnect re-declares it on a new one.
			if attempt == 0 {
				_ = c.recover(context.Background(), cn.gen)
				continue
			}
			c.forget(l)
			return Usage{}, ErrUnreachable
		}
		resp, err := c.leaseFrame(cn, &slotv1.Release{Lease: id, Outcome: outcome})
		if err != nil {
			// A reconnect meanwhile re-declared the lease elsewhere.
			c.mu.Lock()
			moved := l.id != id
			c.mu.Unlock()
			if moved && attempt == 0 {
				continue
			}
			c.forget(l)
			return Usage{}, err
		}
		c.forget(l)
		if resp == nil {
			return Usage{}, nil
		}
		r, ok := resp.(*slotv1.ReleaseOK)
		if !ok {
			return Usage{}, fmt.Errorf("cpuslot: unexpected %T to RELEASE", resp)
		}
		return Usage{CPU: time.Duration(r.CPUNanos), Throttled: time.Duration(r.ThrottledNanos), Periods: r.Periods, ThrottledPeriods: r.ThrottledPeriods}, nil
	}
}

// leaseFrame sends m, a frame naming a lease, on cn, the connection that
// holds the lease: as a request when cn is idle in the pool (its answer
// is returned), else one-way beside the request in flight on it (nil).
func (c *Client) leaseFrame(cn *conn, m *slotv1.Release) (slotv1.Message, error) {
	if !c.takeIdle(cn) {
		one := *m
		one.Flags |= slotv1.ReleaseNoReply
		return nil, cn.sendBeside(&one)
	}
	return c.exclusive(cn, m, c.put)
}

// exclusive makes request m on cn, which no one else uses meanwhile, and
// then hands cn to done, or closes it when it broke.
func (c *Client) exclusive(cn *conn, m slotv1.Message, done func(*conn)) (slotv1.Message, error) {
	resp, fds, err := cn.roundTrip(m)
	closeFDs(fds)
	if err != nil {
		cn.close()
		return nil, err
	}
	done(cn)
	if e, ok := resp.(*slotv1.Error); ok {
		return nil, e
	}
	return resp, nil
}

// releaseOneWay reads the slot's counters and sends RELEASE with NO_REPLY
// on the lease's connection: the invocation pays one write, not a round
// trip.
func (l *Lease) releaseOneWay(outcome slotv1.ReleaseOutcome) (Usage, bool) {
	c := l.c
	c.mu.Lock()
	stat := c.fds[l.Slot]
	id, gen, cn := l.id, l.gen, l.cn
	current := c.gen
	c.mu.Unlock()
	if gen != current {
		return Usage{}, false // reconnected since: release with a reply
	}
	_, stat = c.split(stat)
	end, ok := readCounters(stat)
	if !ok {
		return Usage{}, false
	}
	if err := cn.sendBeside(&slotv1.Release{Lease: id, Outcome: outcome, Flags: slotv1.ReleaseNoReply}); err != nil {
		return Usage{}, false
	}
	c.forget(l)
	return usageOf(end.Sub(l.start)), true
}

func (c *Client) forget(l *Lease) {
	c.mu.Lock()
	delete(c.held, l)
	c.mu.Unlock()
}

// Sleep tells the agent that the lease's invocation waits (on I/O, a
// downstream call): while it sleeps, the container's admission lends part
// of its quota to new invocations (SPEC.md, "Lending"). Its slot keeps
// the quota. Call Wake when the invocation runs again. An agent that does
// not lend (no LEND in HELLO_OK) is sent nothing. A SLEEP over the agent's
// rate is refused (*slotv1.Error, REJECTED): the lease stays awake and the
// invocation goes on as without lending.
//
// Each goes on the connection that holds the lease, after the frames
// sent there before (requests on one connection are taken in order): a
// round trip when no other request is in flight on it, else one-way
// (then a refusal is not seen, and the lease may stay awake).
func (l *Lease) Sleep() error { return l.sleepOrWake(slotv1.ReleaseSleep) }

// Wake tells the agent that the lease's invocation, which slept, runs
// again: it is charged its whole quota at once and the agent lowers the
// youngest awake leases of the container if that exceeds the budget. It
// returns once the agent has done so.
func (l *Lease) Wake() error { return l.sleepOrWake(slotv1.ReleaseWake) }

func (l *Lease) sleepOrWake(flag uint8) error {
	if l.Local && l.released.Load() {
		return ErrReleased
	}
	return l.sendSleepOrWake(flag)
}

// sendSleepOrWake sends SLEEP or WAKE (flag) for the lease on its connection.
func (l *Lease) sendSleepOrWake(flag uint8) error {
	c := l.c
	if c.Hello().Flags&slotv1.HelloOKLend == 0 {
		return nil
	}
	m := &slotv1.Release{Outcome: slotv1.InvocationOK, Flags: flag}
	var resp slotv1.Message
	var err error
	if l.Local {
		resp, err = c.local.leaseFrame(l, m)
	} else {
		c.mu.Lock()
		cn, lost := l.cn, l.lost
		m.Lease = l.id
		c.mu.Unlock()
		if lost {
			return ErrLeaseLost
		}
		resp, err = c.leaseFrame(cn, m)
	}
	if err != nil {
		return err
	}
	if _, ok := resp.(*slotv1.ReleaseOK); resp != nil && !ok {
		return fmt.Errorf("cpuslot: unexpected %T to RELEASE", resp)
	}
	l.sleeping.Store(flag == slotv1.ReleaseSleep)
	return nil
}
