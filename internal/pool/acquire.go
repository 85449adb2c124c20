package pool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/outcome"
)

// Acquire leases a slot of req.QuotaMilli (or less, when degraded).
func (p *Pool) Acquire(ctx context.Context, req Request) (*Grant, error) {
	start := time.Now()
	// Decide: is the request valid, how long may it wait, which thread.
	deadline, err := p.decide(req, start)
	if err != nil {
		return nil, err
	}
	if !req.Hold {
		p.supersede(req)
	}
	host, err := p.hostThread(req)
	if err != nil {
		return nil, err
	}

	// Admit against the budget and pick a slot, waiting for either; the
	// decision is committed under the lock.
	p.mu.Lock()
	t, err := p.admitAndPick(ctx, req, deadline)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	l := p.commit(req, t, host)
	p.mu.Unlock()

	// Execute the plan's cgroup I/O outside the lock.
	fds, spec, err := p.execute(l, t.plan, req)
	if err != nil {
		p.abort(l, t.plan)
		return nil, err
	}
	p.metrics.Acquired(string(p.cfg.Mode), t.plan.outcome, time.Since(start))
	return &Grant{Lease: l.id, SlotID: l.slot.id, FDs: fds, Spec: spec, Outcome: t.plan.outcome,
		Queued: t.queued, Degraded: t.degraded, Place: t.plan.place}, nil
}

// decide checks the request's quota and returns how long it may wait.
func (p *Pool) decide(req Request, start time.Time) (time.Time, error) {
	if req.Hold {
		if err := p.checkHold(req); err != nil {
			return time.Time{}, err
		}
	}
	if max := p.maxQuota(); req.QuotaMilli > max {
		return time.Time{}, errorf(InvalidQuota, "quota %dm is above the largest of %dm (the container's CPU limit, else the configured maximum)", req.QuotaMilli, max)
	}
	if err := p.spec(req.QuotaMilli).Validate(); err != nil {
		return time.Time{}, errorf(InvalidQuota, "%v", err)
	}
	return start.Add(p.waitOf(req)), nil
}

// checkHold refuses a HOLD request that names what a HOLD lease has not
// (a thread, a slot it sits in, an agent placement, an action, an
// invocation), or that this pool's mode does not grant.
func (p *Pool) checkHold(req Request) error {
	switch {
	case !p.GrantsHold():
		return errorf(BadRequest, "this pool's mode (%s) grants no HOLD leases", p.cfg.Mode)
	case req.AgentPlaces:
		return errorf(BadRequest, "a HOLD lease is placed by the client's threads, not by the agent")
	case req.Thread.TID != 0 || req.CurrentSlot != 0:
		return errorf(BadRequest, "a HOLD lease has no thread: tid %d and current slot %d must be 0", req.Thread.TID, req.CurrentSlot)
	case req.Action != "" || req.Invocation != "":
		return errorf(BadRequest, "a HOLD lease has no action or invocation (per-action usage comes in USAGE)")
	}
	return nil
}

// waitOf is how long req may wait for budget or a slot.
func (p *Pool) waitOf(req Request) time.Duration {
	wait := req.Wait
	if wait <= 0 {
		wait = p.cfg.DefaultWait
	}
	return min(wait, p.cfg.MaxWait)
}

// supersede ends the lease the thread still holds: a thread sits in one
// cgroup at a time.
func (p *Pool) supersede(req Request) {
	p.mu.Lock()
	old := p.threadLeases[ownerThread{req.Owner, req.Thread}]
	p.mu.Unlock()
	if old != nil {
		_, _ = p.Release(req.Owner, old.id, outcome.Superseded)
	}
}

// hostThread is the thread's id in the agent's PID namespace and its start
// time, when the mode has the agent write it (else zero).
type hostThread struct {
	tid   int
	start uint64
}

func (p *Pool) hostThread(req Request) (hostThread, error) {
	if req.Hold || !p.mode.needsHostTID(req.AgentPlaces) {
		return hostThread{}, nil
	}
	tid, err := req.HostTID()
	if err != nil {
		return hostThread{}, errorf(BadThread, "thread %d: %v", req.Thread.TID, err)
	}
	start, err := threadStart(tid)
	if err != nil {
		return hostThread{}, errorf(BadThread, "thread %d: %v", req.Thread.TID, err)
	}
	return hostThread{tid, start}, nil
}

// ticket is an admitted and picked acquisition, not yet committed.
type ticket struct {
	plan     plan
	granted  uint32
	degraded bool
	queued   bool
}

// admitAndPick admits the request against the budget and has the mode pick
// a slot, waiting until both succeed or the deadline passes. It is called
// with the lock held, unlocks it while waiting, and returns with it held.
func (p *Pool) admitAndPick(ctx context.Context, req Request, deadline time.Time) (ticket, error) {
	var t ticket
	for {
		if p.closed {
			return t, errorf(Closing, "pool %s is closing", p.name)
		}
		if req.Hold && p.holdCount[req.Owner] >= p.cfg.MaxSlots {
			// Only the process itself can free one: waiting is no use.
			p.metrics.Error(metrics.SlotsExhausted)
			return t, &Error{Reason: NoSlot, RetryAfter: 100 * time.Millisecond,
				Message: fmt.Sprintf("the process holds %d HOLD leases, the most a process may (maxSlots)", p.holdCount[req.Owner])}
		}
		var waitFor string
		d, g, reason := p.budget.Admit(req.QuotaMilli)
		switch d {
		case admission.Refuse:
			p.metrics.Admission(metrics.Rejected)
			return t, errorf(Rejected, "%s", reason)
		case admission.Wait:
			waitFor = "budget"
		case admission.Grant:
			pl, ok := p.pick(req, g)
			if ok {
				t.plan, t.granted, t.degraded = pl, g, g < req.QuotaMilli
				if t.degraded {
					p.metrics.Admission(metrics.Degraded)
				}
				return t, nil
			}
			waitFor = "a free slot"
		}
		if !t.queued {
			t.queued = true
			if waitFor == "budget" {
				p.metrics.Admission(metrics.Queued)
			}
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			if waitFor == "budget" {
				p.metrics.Admission(metrics.AdmissionTimeout)
				return t, &Error{Reason: Timeout, RetryAfter: 10 * time.Millisecond,
					Message: fmt.Sprintf("no budget for %dm within %v (%dm of %dm granted)", req.QuotaMilli, p.waitOf(req), p.budget.Used(), p.budget.Limit)}
			}
			p.metrics.Error(metrics.SlotsExhausted)
			return t, &Error{Reason: NoSlot, RetryAfter: 10 * time.Millisecond,
				Message: fmt.Sprintf("all %d slots busy for %v", p.cfg.MaxSlots, p.waitOf(req))}
		}
		ch := p.changed
		p.mu.Unlock()
		timer := time.NewTimer(remaining)
		select {
		case <-ch:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			p.mu.Lock()
			return t, errorf(Timeout, "request cancelled: %v", ctx.Err())
		}
		timer.Stop()
		p.mu.Lock()
	}
}

// pick has the mode pick a slot of quota q for req; a HOLD lease takes any
// free slot of the quota, preferring one no thread sits in, else one made
// or retuned, and the client's threads place themselves.
func (p *Pool) pick(req Request, q uint32) (plan, bool) {
	if !req.Hold {
		return p.mode.pick(p, req, q)
	}
	if s := p.pickFree(q, true); s != nil {
		return plan{s: s, outcome: outcome.CacheHit, place: PlaceSelf}, true
	}
	return p.growOrRetune(q, PlaceSelf)
}

// commit records the lease under the lock; the plan's I/O runs after.
func (p *Pool) commit(req Request, t ticket, host hostThread) *lease {
	s := t.plan.s
	l := &lease{id: leaseSeq.Add(1), owner: req.Owner, slot: s, thread: req.Thread, hostTID: host.tid, hostStart: host.start,
		want: req.QuotaMilli, granted: t.granted, action: p.actionLabel(req.Action), degraded: t.degraded, start: s.last}
	s.lease = l
	s.adopted = false
	s.busy = t.plan.io()
	p.leases[l.id] = l
	p.budget.Take(t.granted)
	if t.degraded {
		p.degraded = append(p.degraded, l)
	}
	if req.Hold {
		// No thread: nothing to supersede later, no occupant to record.
		l.hold, l.thread, l.action, l.seen, l.heldUntil = true, Thread{}, outcome.HoldAction, l.start, time.Now()
		p.holdCount[l.owner]++
		p.beginIO()
		return l
	}
	p.threadLeases[ownerThread{l.owner, l.thread}] = l
	p.setOccupant(s, req.Thread, host.tid, host.start)
	p.beginIO()
	return l
}

// execute performs a committed plan's cgroup I/O outside the lock, opens
// the slot's fds when the connection needs them, and returns them with the
// slot's settings.
func (p *Pool) execute(l *lease, pl plan, req Request) ([]int, cgroup.Spec, error) {
	s := l.slot
	spec := p.spec(l.granted)
	switch {
	case pl.create:
		io, err := p.backend.CreateSlot(s.id, spec)
		if err != nil {
			if errors.Is(err, cgroup.ErrLimitReached) && !errors.Is(err, cgroup.ErrGone) {
				p.metrics.Error(metrics.MkdirRefused)
				return nil, cgroup.Spec{}, &Error{Reason: NoSlot, RetryAfter: 100 * time.Millisecond, Message: err.Error()}
			}
			return nil, cgroup.Spec{}, p.failed(err, metrics.CreateFailed)
		}
		u, _ := io.Usage()
		p.mu.Lock()
		s.io, s.spec, s.last = io, io.Spec(), u
		l.start, l.seen = u, u
		p.mu.Unlock()
	case pl.retune:
		if err := s.io.Retune(spec); err != nil {
			return nil, cgroup.Spec{}, p.failed(err, metrics.RetuneFailed)
		}
		p.mu.Lock()
		s.spec = spec
		p.mu.Unlock()
	}
	if pl.evict != 0 {
		// The lazy baseline moves the previous occupant out first; a thread
		// that has exited is simply gone.
		p.moveOut(pl.evict, pl.evictStart)
	}
	if pl.place == PlaceDone {
		if err := s.io.Place(l.hostTID); err != nil {
			return nil, cgroup.Spec{}, p.failed(err, metrics.PlaceFailed)
		}
	}
	var fds []int
	if pl.place == PlaceSelf && req.NeedFDs != nil && req.NeedFDs(s.id) {
		var err error
		if fds, err = s.io.OpenFDs(); err != nil {
			return nil, cgroup.Spec{}, p.failed(err, metrics.OpenFailed)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl.io() {
		s.busy = false
	}
	if pl.place == PlaceSelf {
		s.exposed = true
	}
	p.endIO()
	return fds, s.spec, nil
}

// failed turns a failed cgroup operation into the pool's error: the
// client's cue to reconnect when the container is gone, else counted as
// reason.
func (p *Pool) failed(err error, reason metrics.Reason) error {
	if gerr := p.checkGone(err); gerr != nil {
		return gerr
	}
	p.metrics.Error(reason)
	return errorf(Internal, "%v", err)
}

// moveOut moves a thread the agent placed back to the container, if its
// TID still names the thread that was placed (start time): a TID freed by
// an exited thread may belong to another process by now.
func (p *Pool) moveOut(tid int, start uint64) {
	if now, err := threadStart(tid); err != nil || now != start {
		if err == nil {
			p.metrics.Error(metrics.StaleTID)
		}
		return
	}
	_ = p.backend.MoveOut(tid) // the thread may have exited meanwhile
}

// abort undoes a committed lease whose I/O failed.
func (p *Pool) abort(l *lease, pl plan) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endIO()
	p.forgetLease(l)
	p.endSleep(l)
	p.budget.Give(l.charged())
	p.dropDegraded(l)
	s := l.slot
	s.lease, s.busy = nil, false
	if !l.hold && s.occupant == l.thread {
		p.vacate(s)
	}
	if pl.create && s.io == nil {
		delete(p.slots, s.id)
	}
	s.freeSince = time.Now()
	p.broadcast()
}
