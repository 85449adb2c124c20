// Package client is the Go client of the cpuslot slot protocol.
//
// A runtime calls Acquire on the OS thread that will run an invocation
// (in Go: a goroutine that called runtime.LockOSThread), runs the
// invocation, and calls Release. Acquire places the calling thread in the
// granted slot, usually with one write of "0" to a slot fd the agent passed
// earlier, or with no write at all when the thread already sits there.
//
// A Client is safe for concurrent use. It keeps a pool of connections (one
// request in flight on each), caches slot fds, and after an agent restart
// reconnects and re-declares the leases it holds.
//
// When the agent grants it (HELLO_OK with LOCAL), the client leases locally
// (local.go; Options.NoLocal turns it off): the process holds slots and its
// threads claim them in a slot table in shared memory, so an invocation
// sends nothing to the agent unless no held slot of its quota is free, and
// keeps running in held slots while the agent restarts.
package client

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/counters"
)

// Options tune a Client.
type Options struct {
	// Name is sent in HELLO for the agent's logs.
	Name string
	// Wait is the wait budget sent with each acquisition (0: the agent's
	// default).
	Wait time.Duration
	// Timeout bounds each round trip to the agent (default 5s).
	Timeout time.Duration
	// AgentPlaces asks the agent to place threads instead of passing fds.
	AgentPlaces bool
	// ReconnectFor is how long a failed call keeps trying to reach a
	// restarting agent before giving up (default 2s).
	ReconnectFor time.Duration
	// Linger keeps a lease for this long after an invocation ends, so that
	// the next invocation of the same action at the same quota on the same
	// thread reuses it with no message to the agent at all. Quota
	// enforcement is unchanged; an idle lingering lease holds admission
	// budget until it expires, and the agent sees one lease for the
	// invocations that reused it. 0 releases at once. Unused with local
	// leasing, which needs no message per invocation at all.
	Linger time.Duration
	// NoLocal turns local leasing off: every invocation asks the agent for
	// a lease of its own thread (the path before local leasing).
	NoLocal bool
	// LocalIdle is how long a held slot may go unused before the client
	// gives it back (default 30s): a held slot counts against the
	// container's admission budget.
	LocalIdle time.Duration
	// TableCapacity is the number of entries of the slot table the client
	// creates (default 128, at most 1024). When the table is full a miss
	// leases for the thread alone, as without local leasing.
	TableCapacity int
	// TableFile is the memfd of a slot table to share instead of creating
	// one: another process of the container created it (Client.Table) and
	// passed it down. Dial refuses a table it cannot use (slotv1.ErrBadTable;
	// slotv1.ErrTableLayout for one of another layout version). The client
	// uses a duplicate; the caller keeps TableFile.
	TableFile *os.File
}

// Client talks to one agent socket.
type Client struct {
	path string
	opts Options

	mu    sync.Mutex
	idle  []*conn
	gen   uint64 // bumped on every reconnect
	hello slotv1.HelloOK
	// fds caches each slot's placement fds (replaced when new ones come).
	fds map[uint32][]int
	// current remembers which slot each thread placed itself in last.
	current map[int]uint32
	// held are the leases not yet released, re-declared after a reconnect.
	held map[*Lease]struct{}
	// parked are lingering leases by thread (see Options.Linger).
	parked map[int]*Lease
	// lastEntry is the slot table entry each thread used last.
	lastEntry map[int]int
	// local is the local leasing state once an agent granted LOCAL;
	// localOn says the agent of the current connections grants it.
	local   *local
	localOn atomic.Bool
	// heldOn says the agent of the current connections answers HELD.
	heldOn atomic.Bool
	stop   chan struct{}

	recoverMu sync.Mutex
	closed    bool
	// down: the last reconnect failed; checkAgent tries again.
	down bool
}

// Usage is what a lease's slot used while held.
type Usage struct {
	CPU              time.Duration
	Throttled        time.Duration
	Periods          uint64
	ThrottledPeriods uint64
}

// Lease is a granted slot.
type Lease struct {
	c          *Client
	id         uint64
	gen        uint64
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
}

// Dial connects to the agent and says HELLO.
func Dial(path string, opts Options) (*Client, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.ReconnectFor <= 0 {
		opts.ReconnectFor = 2 * time.Second
	}
	c := &Client{path: path, opts: opts, fds: map[uint32][]int{}, current: map[int]uint32{}, held: map[*Lease]struct{}{},
		parked: map[int]*Lease{}, lastEntry: map[int]int{}, stop: make(chan struct{})}
	cn, err := c.dial()
	if err != nil {
		return nil, err
	}
	if !opts.NoLocal && !opts.AgentPlaces {
		if c.local, err = newLocal(c); err != nil {
			cn.close()
			return nil, err
		}
	}
	c.put(cn)
	if opts.Linger > 0 {
		go c.expireParked()
	}
	return c, nil
}

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

// Table is the slot table of local leasing (nil without): its File can be
// passed to a child process of the same container (Options.TableFile).
func (c *Client) Table() *slotv1.Table {
	if c.local == nil {
		return nil
	}
	return c.local.t
}

// Hello is what the agent said about this client's container.
func (c *Client) Hello() slotv1.HelloOK {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hello
}

// Close closes every connection and cached fd. Leases still held are
// released by the agent once the process's last connection is gone.
func (c *Client) Close() error {
	c.mu.Lock()
	parked := c.parked
	c.parked = map[int]*Lease{}
	c.mu.Unlock()
	for _, l := range parked {
		l.releaseParked()
	}
	if c.local != nil {
		c.local.flush()
		c.local.close()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		close(c.stop)
	}
	c.closed = true
	for _, cn := range c.idle {
		cn.close()
	}
	c.idle = nil
	for _, fds := range c.fds {
		closeFDs(fds)
	}
	c.fds = map[uint32][]int{}
	return nil
}

// Acquire leases a slot of quotaMilli for an invocation and places the
// calling OS thread in it.
func (c *Client) Acquire(quotaMilli uint32, action, invocation string) (*Lease, error) {
	tid := unix.Gettid()
	if c.local != nil && (c.localOn.Load() || c.opts.TableFile != nil) {
		l, err := c.local.acquire(tid, quotaMilli, action)
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
	req := &slotv1.Acquire{QuotaMilli: quotaMilli, TID: uint32(tid), CurrentSlot: cur, Action: action, Invocation: invocation,
		WaitUS: uint32(min(c.opts.Wait.Microseconds(), 1<<32-1))}
	if c.opts.AgentPlaces {
		req.Flags |= slotv1.AcquireAgentPlaces
	}
	resp, fds, gen, err := c.call(req)
	if err != nil {
		return nil, err
	}
	ok, isOK := resp.(*slotv1.AcquireOK)
	if !isOK {
		closeFDs(fds)
		return nil, fmt.Errorf("cpuslot: unexpected %T to ACQUIRE", resp)
	}
	l := &Lease{c: c, id: ok.Lease, gen: gen, Slot: ok.Slot, QuotaMilli: ok.QuotaMilli, Outcome: ok.Outcome, Place: ok.Place,
		Queued: ok.Flags&slotv1.AcquiredQueued != 0, Degraded: ok.Flags&slotv1.AcquiredDegraded != 0,
		tid: tid, action: action, invocation: invocation}
	c.mu.Lock()
	c.cacheFDs(ok.Slot, fds)
	slotFDs := c.fds[ok.Slot]
	c.held[l] = struct{}{}
	c.mu.Unlock()

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

// split divides a slot's cached fds into placement and counter fds as the
// agent announced in HELLO_OK.
func (c *Client) split(fds []int) (place, stat []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.splitLocked(fds)
}

func (c *Client) splitLocked(fds []int) (place, stat []int) {
	p, s := int(c.hello.PlaceFDs), int(c.hello.StatFDs)
	if p == 0 || len(fds) != p+s {
		return fds, nil // an agent that passes placement fds only
	}
	return fds[:p], fds[p:]
}

func (c *Client) setCurrent(tid int, slot uint32) {
	c.mu.Lock()
	if slot == 0 {
		delete(c.current, tid)
	} else {
		c.current[tid] = slot
	}
	c.mu.Unlock()
}

var zero = []byte("0")

// placeSelf moves the calling thread into a slot: one write per hierarchy.
func placeSelf(fds []int) error {
	if len(fds) == 0 {
		return errors.New("no fd cached for the slot")
	}
	for _, fd := range fds {
		if _, err := unix.Write(fd, zero); err != nil {
			return err
		}
	}
	return nil
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

func readCounters(stat []int) (counters.Usage, bool) {
	if len(stat) == 0 {
		return counters.Usage{}, false
	}
	acct := -1
	if len(stat) > 1 {
		acct = stat[1]
	}
	u, err := counters.Read(stat[0], acct)
	return u, err == nil
}

func usageOf(d counters.Usage) Usage {
	return Usage{CPU: time.Duration(d.CPUNanos), Throttled: time.Duration(d.ThrottledNanos), Periods: d.Periods, ThrottledPeriods: d.ThrottledPeriods}
}

// releaseWithReply sends RELEASE and waits for the agent's usage.
func (l *Lease) releaseWithReply(outcome slotv1.ReleaseOutcome) (Usage, error) {
	c := l.c
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		id, lost := l.id, l.lost
		c.mu.Unlock()
		if lost {
			c.forget(l)
			return Usage{}, errors.New("cpuslot: lease lost across an agent restart; usage unknown")
		}
		resp, _, _, err := c.call(&slotv1.Release{Lease: id, Outcome: outcome})
		if err != nil {
			// A reconnect during the call re-declared the lease under a new
			// id: release that one.
			c.mu.Lock()
			moved := l.id != id
			c.mu.Unlock()
			var pe *slotv1.Error
			if errors.As(err, &pe) && pe.Code == slotv1.CodeUnknownLease && moved && attempt == 0 {
				continue
			}
			c.forget(l)
			return Usage{}, err
		}
		c.forget(l)
		r, ok := resp.(*slotv1.ReleaseOK)
		if !ok {
			return Usage{}, fmt.Errorf("cpuslot: unexpected %T to RELEASE", resp)
		}
		return Usage{CPU: time.Duration(r.CPUNanos), Throttled: time.Duration(r.ThrottledNanos), Periods: r.Periods, ThrottledPeriods: r.ThrottledPeriods}, nil
	}
}

// releaseOneWay reads the slot's counters and sends RELEASE with NO_REPLY:
// the invocation pays one write, not a round trip.
func (l *Lease) releaseOneWay(outcome slotv1.ReleaseOutcome) (Usage, bool) {
	c := l.c
	c.mu.Lock()
	stat := c.fds[l.Slot]
	id, gen := l.id, l.gen
	c.mu.Unlock()
	_, stat = c.split(stat)
	end, ok := readCounters(stat)
	if !ok {
		return Usage{}, false
	}
	cn, err := c.get()
	if err != nil || cn.gen != gen {
		if err == nil {
			c.put(cn)
		}
		return Usage{}, false // reconnected since: release with a reply
	}
	if err := cn.send(&slotv1.Release{Lease: id, Outcome: outcome, Flags: slotv1.ReleaseNoReply}); err != nil {
		cn.close()
		return Usage{}, false
	}
	c.put(cn)
	c.forget(l)
	return usageOf(end.Sub(l.start)), true
}

// checkAgent notices, off the invocation path, that the agent went away
// (idle connections hung up), and reconnects: a client whose invocations
// all hit held slots sends nothing else that would notice, and the new
// agent must learn which slots it holds (RECLAIM).
func (c *Client) checkAgent() {
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
	if broken {
		_ = c.recover(gen)
	}
}

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

func (c *Client) forget(l *Lease) {
	c.mu.Lock()
	delete(c.held, l)
	c.mu.Unlock()
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
			c.put(cn)
			if e, ok := resp.(*slotv1.Error); ok {
				return nil, nil, cn.gen, e
			}
			return resp, fds, cn.gen, nil
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

// recover reconnects after connection generation gen failed, unless another
// caller already did, and re-declares held leases on the new connection.
func (c *Client) recover(gen uint64) error {
	c.recoverMu.Lock()
	defer c.recoverMu.Unlock()
	c.mu.Lock()
	if c.gen != gen {
		c.mu.Unlock()
		return nil // someone else reconnected meanwhile
	}
	for _, cn := range c.idle {
		cn.close()
	}
	c.idle = nil
	c.gen++
	c.down = true // until the leases are re-declared
	c.mu.Unlock()

	deadline := time.Now().Add(c.opts.ReconnectFor)
	var cn *conn
	var err error
	for delay := 5 * time.Millisecond; ; delay = min(delay*2, 200*time.Millisecond) {
		if cn, err = c.dial(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(delay)
	}
	c.mu.Lock()
	var held []*Lease
	for l := range c.held {
		if l.gen < c.gen && !l.lost {
			held = append(held, l)
		}
	}
	c.mu.Unlock()
	for _, l := range held {
		resp, fds, err := cn.roundTrip(&slotv1.Reclaim{Slot: l.Slot, QuotaMilli: l.QuotaMilli, TID: uint32(l.tid), Action: l.action, Invocation: l.invocation})
		if err != nil {
			cn.close()
			return err
		}
		c.mu.Lock()
		if ok, isOK := resp.(*slotv1.AcquireOK); isOK {
			l.id, l.gen = ok.Lease, cn.gen
			c.cacheFDs(ok.Slot, fds)
		} else {
			l.lost = true
			closeFDs(fds)
		}
		c.mu.Unlock()
	}
	if c.local != nil {
		if err := c.local.reclaimAll(cn); err != nil {
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

// cacheFDs replaces a slot's cached fds with ones just received (the
// agent only sends fds that are valid now). The caller holds c.mu.
func (c *Client) cacheFDs(slot uint32, fds []int) {
	if len(fds) > 0 {
		closeFDs(c.fds[slot])
		c.fds[slot] = fds
	}
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// conn is one blocking connection. Blocking syscalls let a locked OS thread
// sleep in the kernel and wake directly when the answer arrives.
type conn struct {
	fd  int
	gen uint64
	req uint32
	out []byte
	buf []byte
	oob []byte
}

func (c *Client) dial() (*conn, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	tv := unix.NsecToTimeval(c.opts.Timeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: c.path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("cpuslot: connecting to %s: %w", c.path, err)
	}
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	cn := &conn{fd: fd, gen: gen, buf: make([]byte, 0, 256), oob: make([]byte, unix.CmsgSpace(4*8))}
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
	resp, fds, err := cn.roundTrip(&slotv1.Hello{MinVersion: slotv1.Version, MaxVersion: slotv1.Version, Flags: flags, Client: name})
	closeFDs(fds)
	if err != nil {
		cn.close()
		return nil, err
	}
	switch h := resp.(type) {
	case *slotv1.HelloOK:
		c.mu.Lock()
		c.hello = *h
		c.mu.Unlock()
		c.localOn.Store(flags&slotv1.HelloLocal != 0 && h.Flags&slotv1.HelloOKLocal != 0 && h.Flags&slotv1.HelloOKAgentPlaces == 0)
		c.heldOn.Store(c.localOn.Load() && h.Flags&slotv1.HelloOKHeld != 0)
		return cn, nil
	case *slotv1.Error:
		cn.close()
		return nil, h
	}
	cn.close()
	return nil, fmt.Errorf("cpuslot: unexpected %T to HELLO", resp)
}

func (cn *conn) close() {
	if cn.fd >= 0 {
		unix.Close(cn.fd)
		cn.fd = -1
	}
}

// send writes one request.
func (cn *conn) send(m slotv1.Message) error {
	cn.req++
	var err error
	if cn.out, err = slotv1.Append(cn.out[:0], cn.req, m); err != nil {
		return err
	}
	for off := 0; off < len(cn.out); {
		n, err := unix.Write(cn.fd, cn.out[off:])
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
	var fds []int
	cn.buf = cn.buf[:0]
	need := slotv1.HeaderLen
	for len(cn.buf) < need {
		if cap(cn.buf) < need {
			nb := make([]byte, len(cn.buf), need)
			copy(nb, cn.buf)
			cn.buf = nb
		}
		n, oobn, err := cn.recv(cn.buf[len(cn.buf):need], cn.oob)
		if err != nil {
			closeFDs(fds)
			return nil, nil, err
		}
		if n == 0 {
			closeFDs(fds)
			return nil, nil, errors.New("agent closed the connection")
		}
		if oobn > 0 {
			fds = append(fds, parseRights(cn.oob[:oobn])...)
		}
		cn.buf = cn.buf[:len(cn.buf)+n]
		if len(cn.buf) == slotv1.HeaderLen && need == slotv1.HeaderLen {
			body, err := slotv1.BodyLen(cn.buf)
			if err != nil {
				closeFDs(fds)
				return nil, nil, err
			}
			need += body
		}
	}
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
