package server

import (
	"errors"
	"fmt"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/pool"
)

// The handlers: one a request type; handle only dispatches. Results
// become wire messages in wire.go.

// handle answers one request; false closes the connection.
func (c *conn) handle(f slotv1.Frame) bool {
	if c.pool == nil {
		h, ok := f.Msg.(*slotv1.Hello)
		if !ok {
			c.srv.metrics.Error(metrics.NoHello)
			return c.fail(f.Request, slotv1.Errorf(slotv1.CodeBadRequest, "the first request must be HELLO")) && false
		}
		return c.hello(f.Request, h)
	}
	// Every request is the opener's: a connection that outlived its
	// process (a child inherited it, or it was passed on) gets nothing
	// more. The session's watch shuts it soon; this closes the gap. What
	// the process itself queued before its exit may still end its leases
	// and report their usage (lastWords).
	if err := c.alive(); err != nil && !c.srv.lastWords(c.session, f) {
		c.srv.metrics.Error(metrics.NotServed)
		c.srv.log.Info("request on a connection whose process has exited; closing", "container", c.pool.Name(), "pid", c.peer.PID)
		c.fail(f.Request, &NotServed{Reason: err.Error()})
		return false
	}
	switch m := f.Msg.(type) {
	case *slotv1.Acquire:
		c.recheckConfined()
		return c.acquire(f.Request, m)
	case *slotv1.Release:
		return c.release(f.Request, m)
	case *slotv1.Reclaim:
		c.recheckConfined()
		return c.reclaim(f.Request, m)
	case *slotv1.Usage:
		return c.usage(f.Request, m)
	case *slotv1.HoldListRequest:
		return c.holdList(f.Request)
	case *slotv1.Hello:
		return c.fail(f.Request, slotv1.Errorf(slotv1.CodeBadRequest, "HELLO sent twice"))
	}
	c.srv.metrics.Error(metrics.BadRequest)
	return c.fail(f.Request, slotv1.Errorf(slotv1.CodeBadRequest, "unexpected %T from a client", f.Msg))
}

func (c *conn) hello(request uint32, h *slotv1.Hello) bool {
	if h.MinVersion > slotv1.Version || h.MaxVersion < slotv1.Version {
		c.fail(request, slotv1.Errorf(slotv1.CodeUnsupportedVersion, "client speaks %d..%d, agent speaks %d", h.MinVersion, h.MaxVersion, slotv1.Version))
		return false
	}
	p, err := c.resolve.Resolve(c.peer)
	if err == nil {
		err = c.alive()
		if err != nil {
			err = &NotServed{Reason: err.Error()}
		}
	}
	if err != nil {
		var nr *NotReady
		if errors.As(err, &nr) {
			return c.fail(request, err) // the client may say HELLO again later
		}
		c.srv.metrics.Error(metrics.NotServed)
		c.srv.log.Warn("refused peer", "pid", c.peer.PID, "uid", c.peer.UID, "err", err)
		c.fail(request, err)
		return false
	}
	// The connection leaves the node's share for its container's.
	ctr := c.resolve.Serving(c.charge.cgroup)
	c.srv.mu.Lock()
	ok := c.srv.charges.named(&c.charge, ctr, c.srv.limits)
	c.srv.mu.Unlock()
	if !ok {
		c.srv.metrics.Error(metrics.ConnectionLimit)
		c.srv.log.Debug("connection refused at HELLO: its container's share is full", "pid", c.peer.PID, "container", ctr)
		return false
	}
	c.pool, c.pace = p, c.srv.paceOf(p)
	c.c.SetReadDeadline(time.Time{})
	if h.Flags&slotv1.HelloFDPassing != 0 {
		err := c.passesFDs()
		c.fds = err == nil
		if err != nil {
			c.srv.log.Debug("the agent places this peer's threads", "pid", c.peer.PID, "reason", err)
		}
	}
	return c.send(request, c.helloOK(h, p), nil)
}

// helloOK is the answer to a HELLO the agent took, and settles whether the
// connection is LOCAL.
func (c *conn) helloOK(h *slotv1.Hello, p *pool.Pool) *slotv1.HelloOK {
	sum := p.Summary()
	place, stat := c.srv.hierarchy.SlotFDs()
	ok := &slotv1.HelloOK{Version: slotv1.Version, Hierarchy: uint8(c.srv.hierarchy.Version), PlaceFDs: uint8(place), StatFDs: uint8(stat),
		Container: slotv1.Clean(truncate(sum.Name, slotv1.MaxStringLen)), BudgetMilli: sum.BudgetMilli}
	if c.srv.hierarchy.FavorDynMods {
		ok.Flags |= slotv1.HelloOKFavorDynMods
	}
	if !c.fds {
		ok.Flags |= slotv1.HelloOKAgentPlaces
	}
	// LOCAL needs fds: the client's threads place themselves in the slots
	// the process holds.
	if c.local = h.Flags&slotv1.HelloLocal != 0 && c.fds && p.GrantsHold(); c.local {
		ok.Flags |= slotv1.HelloOKLocal | slotv1.HelloOKHoldList
	}
	if p.Lends() {
		ok.Flags |= slotv1.HelloOKLend
	}
	for _, q := range sum.Quotas {
		ok.Pools = append(ok.Pools, slotv1.PoolSummary{QuotaMilli: q.QuotaMilli, PeriodUS: q.PeriodUS, Slots: uint16(min(q.Slots, 0xFFFF)), Free: uint16(min(q.Free, 0xFFFF))})
	}
	c.srv.log.Debug("client connected", "container", sum.Name, "pid", c.peer.PID, "client", h.Client, "fds", c.fds, "local", c.local)
	return ok
}

// release ends a lease and answers its usage; with SLEEP or WAKE it
// leaves the lease and marks it asleep or awake instead (sleepOrWake).
func (c *conn) release(request uint32, m *slotv1.Release) bool {
	if m.Flags&(slotv1.ReleaseSleep|slotv1.ReleaseWake) != 0 {
		return c.sleepOrWake(request, m)
	}
	u, err := c.pool.Release(c.owner, m.Lease, ending(m.Outcome))
	if c.pool.MovesOnRelease() && c.peer.PID != c.srv.self {
		c.srv.guard.check() // the agent moved the thread out
		if err == nil {
			c.owesPlacement.Add(1)
		}
	}
	if m.Flags&slotv1.ReleaseNoReply != 0 {
		// errors are counted by the pool; nothing is sent
		if err != nil {
			c.owesTurn.Store(true)
		}
		return true
	}
	if err != nil {
		return c.fail(request, err)
	}
	return c.send(request, &slotv1.ReleaseOK{CPUNanos: u.CPUNanos, ThrottledNanos: u.ThrottledNanos,
		Periods: u.Periods, ThrottledPeriods: u.ThrottledPeriods}, nil)
}

// sleepOrWake takes a RELEASE with SLEEP or WAKE: the lease's invocation sleeps or
// woke up (SPEC.md, "Lending"); the lease is not released.
func (c *conn) sleepOrWake(request uint32, m *slotv1.Release) bool {
	var err error
	switch {
	case m.Flags&slotv1.ReleaseSleep != 0 && m.Flags&slotv1.ReleaseWake != 0:
		c.srv.metrics.Error(metrics.BadRequest)
		err = slotv1.Errorf(slotv1.CodeBadRequest, "SLEEP and WAKE together")
	case m.Outcome != slotv1.InvocationOK:
		c.srv.metrics.Error(metrics.BadRequest)
		err = slotv1.Errorf(slotv1.CodeBadRequest, "SLEEP or WAKE with outcome %v, want OK", m.Outcome)
	case m.Flags&slotv1.ReleaseSleep != 0 && !c.pace.sleeps.allow():
		c.srv.metrics.Error(metrics.SleepThrottled)
		err = &slotv1.Error{Code: slotv1.CodeRejected, RetryAfterMS: sleepRetry,
			Message: fmt.Sprintf("SLEEP at most %d times a second per container: the lease stays awake", SleepRate)}
	case m.Flags&slotv1.ReleaseSleep != 0:
		err = c.pool.Sleep(c.owner, m.Lease)
	default:
		err = c.pool.Wake(c.owner, m.Lease)
	}
	c.owesTurn.Store(true) // every SLEEP and WAKE, taken or not
	if m.Flags&slotv1.ReleaseNoReply != 0 {
		return true // errors are counted; nothing is sent
	}
	if err != nil {
		return c.fail(request, err)
	}
	return c.send(request, &slotv1.ReleaseOK{}, nil)
}

// takeTurns takes the turns the frames taken since the last ones owe their
// container's paces: one of its frame pace (PacedRate), one of its
// placement pace (Limits.PlacementRate) per thread the agent moved. Past
// a rate the connection is not read until its turn is due. false: the
// process exited or the agent stops.
func (c *conn) takeTurns() bool {
	frame, placements := c.owesTurn.Swap(false), c.owesPlacement.Swap(0)
	if c.pace == nil {
		return true // before HELLO a connection has its deadline
	}
	if frame && !c.takeTurn(c.pace.frames, metrics.FramePaced) {
		return false
	}
	for ; placements > 0; placements-- {
		if !c.takeTurn(c.pace.placements, metrics.PlacementPaced) {
			return false
		}
	}
	return true
}

// takeTurn takes one turn of pace l, waiting past its rate, counted as
// reason.
func (c *conn) takeTurn(l *turns, reason metrics.Reason) bool {
	if l.allow() {
		return true
	}
	c.srv.metrics.Error(reason)
	if c.session.gone.Load() {
		return true // a flood queued before the exit: nobody waits on it
	}
	// The wait ends early when the process exits (its last words are
	// read on, unpaced) or the agent stops (the connection closes).
	return l.wait(c.session.ctx) == nil || c.srv.ctx.Err() == nil
}

// badRequest answers a request the agent refuses as malformed, and counts
// it; the connection stays open.
func (c *conn) badRequest(request uint32, format string, args ...any) bool {
	c.srv.metrics.Error(metrics.BadRequest)
	return c.fail(request, slotv1.Errorf(slotv1.CodeBadRequest, format, args...))
}

func (c *conn) acquire(request uint32, m *slotv1.Acquire) bool {
	hold := m.Flags&slotv1.AcquireHold != 0
	if hold && !c.local {
		return c.badRequest(request, "HOLD needs a connection granted LOCAL at HELLO")
	}
	req := pool.Request{
		Owner: c.owner, QuotaMilli: m.QuotaMilli, Thread: pool.Thread{NS: c.peer.NS, TID: m.TID},
		CurrentSlot: m.CurrentSlot, AgentPlaces: !c.fds || m.Flags&slotv1.AcquireAgentPlaces != 0,
		Wait: time.Duration(m.WaitUS) * time.Microsecond, Action: m.Action, Invocation: m.Invocation,
		Hold: hold,
	}
	req.HostTID = func() (int, error) { return c.hostTID(m.TID) }
	req.NeedFDs = c.needFDs
	g, err := c.pool.Acquire(c.ctx, req)
	if errors.Is(err, pool.ErrBadRequest) {
		c.srv.metrics.Error(metrics.BadRequest)
	}
	if !hold && c.peer.PID != c.srv.self && c.pool.AgentPlaces(req.AgentPlaces) {
		c.srv.guard.check() // an agent placement (or eviction) may have run
		c.owesPlacement.Add(1)
	}
	if err != nil {
		return c.fail(request, err)
	}
	return c.grant(request, g)
}

// reclaim re-declares a lease after a reconnect: a thread's, or with tid 0
// and no action a HOLD lease (only on a LOCAL connection).
func (c *conn) reclaim(request uint32, m *slotv1.Reclaim) bool {
	var g *pool.Grant
	var err error
	if m.TID == 0 && m.Action == "" {
		if !c.local {
			return c.badRequest(request, "RECLAIM of a HOLD lease (tid 0, no action) needs a connection granted LOCAL at HELLO")
		}
		if m.Invocation != "" {
			return c.badRequest(request, "a HOLD lease has no invocation")
		}
		g, err = c.pool.ReclaimHold(c.owner, m.Slot, m.QuotaMilli)
	} else {
		g, err = c.pool.Reclaim(c.owner, m.Slot, m.QuotaMilli, pool.Thread{NS: c.peer.NS, TID: m.TID}, m.Action)
	}
	if err != nil {
		return c.fail(request, err)
	}
	return c.grant(request, g)
}

// usage credits a USAGE report. It is one-way: nothing is answered unless
// it is refused, and then the connection is closed (its sender reads no
// answer, so it would be out of step). Its cost is bounded per frame like
// any request's: at most MaxUsageRecords records, each a label lookup.
func (c *conn) usage(request uint32, m *slotv1.Usage) bool {
	if !c.local {
		c.badRequest(request, "USAGE needs a connection granted LOCAL at HELLO")
		return false
	}
	if !c.pace.usage.allow() {
		c.srv.metrics.Error(metrics.UsageThrottled)
		if c.session.gone.Load() {
			return true // a flood queued before the exit: nobody waits on it
		}
		if c.pace.usage.wait(c.session.ctx) != nil {
			return false // the agent is stopping, or the process exited
		}
	}
	rs := make([]pool.Report, len(m.Records))
	for i, r := range m.Records {
		rs[i] = pool.Report{Action: r.Action, How: ending(r.Outcome), N: uint64(r.Invocations), CPUNanos: r.CPUNanos, ThrottledNanos: r.ThrottledNanos}
	}
	c.pool.Reported(c.owner, rs)
	return true
}

// holdList answers HOLD_LIST: the process's HOLD leases as granted now, and how
// much of them to give back so that the container fits its budget again.
// Its cost is bounded: at most holdListRate answers a second per process, each
// listing at most MaxHoldListLeases leases.
func (c *conn) holdList(request uint32) bool {
	if !c.local {
		return c.badRequest(request, "HOLD_LIST needs a connection granted LOCAL at HELLO")
	}
	if !c.session.holdList.allow() {
		c.srv.metrics.Error(metrics.HoldListThrottled)
		return c.send(request, &slotv1.Error{Code: slotv1.CodeRejected, RetryAfterMS: holdListRetry,
			Message: fmt.Sprintf("HOLD_LIST at most %d times a second per process", holdListRate)}, nil)
	}
	h := c.pool.HoldList(c.owner, slotv1.MaxHoldListLeases)
	ok := &slotv1.HoldListOK{BudgetMilli: h.BudgetMilli, GiveBackMilli: h.GiveBackMilli, Leases: make([]slotv1.HoldLease, len(h.Leases))}
	for i, l := range h.Leases {
		ok.Leases[i] = slotv1.HoldLease{Lease: l.Lease, Slot: l.SlotID, QuotaMilli: l.QuotaMilli}
		if l.Degraded {
			ok.Leases[i].Flags = slotv1.HoldDegraded
		}
	}
	return c.send(request, ok, nil)
}

// needFDs reports whether this connection takes fds and was not yet sent
// those of slot id.
func (c *conn) needFDs(id uint32) bool { return c.fds && !c.seen[id] }

func (c *conn) grant(request uint32, g *pool.Grant) bool {
	defer g.CloseFDs() // opened for this grant; the client got its copies
	resp := &slotv1.AcquireOK{Lease: g.Lease, Slot: g.SlotID, QuotaMilli: g.Spec.QuotaMilli, PeriodUS: g.Spec.PeriodUS,
		Outcome: outcomes[g.Outcome], Place: places[g.Place]}
	if g.Queued {
		resp.Flags |= slotv1.AcquiredQueued
	}
	if g.Degraded {
		resp.Flags |= slotv1.AcquiredDegraded
	}
	var fds []int
	if len(g.FDs) > 0 {
		fds = g.FDs
		resp.NumFDs = uint8(len(fds))
		c.seen[g.SlotID] = true
	}
	return c.send(request, resp, fds)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
