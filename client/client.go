// Package client is the Go client of the cpuslot slot protocol.
//
// A runtime calls Acquire on the OS thread that will run an invocation
// (in Go: a goroutine that called runtime.LockOSThread), runs the
// invocation, and calls Release. Acquire places the calling thread in the
// granted slot, usually with one write of "0" to a slot fd the agent passed
// earlier, or with no write at all when the thread already sits there.
//
// In Go, give GOMAXPROCS at least one P per thread that runs in a slot at
// once, and one more: a locked thread that its slot's quota throttles keeps
// its P, so with fewer Ps the other threads in slots wait for one although
// their quotas are free (docs/lending.md, "The benchmark's client"). Go's
// default in a container is its CPU limit rounded up, at least 2.
//
// A Client is safe for concurrent use. It keeps a pool of connections (one
// request in flight on each), caches slot fds, and after an agent restart
// reconnects and re-declares the leases it holds.
//
// When the agent grants it (HELLO_OK with LOCAL), the client leases locally
// (local*.go; Options.NoLocal turns it off): the process holds slots and its
// threads claim them in a slot table in shared memory, so an invocation
// sends nothing to the agent unless no held slot of its quota is free, and
// keeps running in held slots while the agent restarts.
package client

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
)

// Options tune a Client.
type Options struct {
	// Name is sent in HELLO for the agent's logs.
	Name string
	// Wait is the wait budget sent with each acquisition (0: the agent's
	// default). With local leasing it also bounds a thread's wait in turn
	// for a held slot: one Wait, or one after the agent's last grant of
	// its quota meanwhile, whichever ends later; then Acquire returns a
	// TIMEOUT error (0: no bound of the client's own).
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
	// holdListOn says the agent of the current connections answers HOLD_LIST.
	holdListOn atomic.Bool
	stop       chan struct{}

	recoverMu sync.Mutex
	closed    bool
	// down: the last reconnect failed; checkAgent tries again.
	down bool
}

// Dial connects to the agent and says HELLO: DialContext with a context
// that never ends (Options.Timeout bounds the wait for the agent).
func Dial(path string, opts Options) (*Client, error) {
	return DialContext(context.Background(), path, opts)
}

// DialContext connects to the agent and says HELLO; it returns ctx's error
// once ctx ends.
func DialContext(ctx context.Context, path string, opts Options) (*Client, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.ReconnectFor <= 0 {
		opts.ReconnectFor = 2 * time.Second
	}
	c := &Client{path: path, opts: opts, fds: map[uint32][]int{}, current: map[int]uint32{}, held: map[*Lease]struct{}{},
		parked: map[int]*Lease{}, lastEntry: map[int]int{}, stop: make(chan struct{})}
	cn, err := c.dial(ctx)
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
// released by the agent as their connections close.
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
		// A HOLD request on its way gets its grant back while the
		// connections are still open.
		c.local.asks.Wait()
		c.local.stop() // its background loop may be using the hold connection
		c.local.closeConn()
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
