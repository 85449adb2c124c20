package server

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/cpuslot/cpuslot/internal/metrics"
)

// Accepts are paced, so that a peer that connects and closes again as fast
// as it can (reconnect churn) buys a bounded share of the agent's work
// (docs/security.md, "Limits"):
//
//   - each listening socket has a bucket of accepts; while it is empty the
//     accept loop stops accepting on that socket, and new connects wait in
//     the socket's backlog (or fail with EAGAIN once it is full) at no cost
//     to the agent. A container's own socket is paced as one peer
//     (AcceptRate, AcceptBurst); the shared socket by SharedAcceptRate, in
//     bursts of MaxConns.
//   - on the shared socket each user (SO_PEERCRED, one getsockopt) and each
//     cgroup has a bucket of its own (AcceptRate, AcceptBurst): a
//     connection whose user's bucket is empty is closed before its cgroup
//     is read, one whose cgroup's is empty before anything else is done.
//     Root has no user's bucket: it is the user of every container without
//     a user namespace, and one of them would empty it for all. Its peers'
//     cgroup reads are bounded by the socket's bucket, which only delays.
//
// The per-user and per-cgroup buckets are bounded in number (maxPeerBuckets
// each): beyond, new peers share one bucket until full buckets (as good as
// none) are swept out, so a spray of users or cgroups cannot grow memory.

// maxPeerBuckets bounds the buckets of users, and those of cgroups, of one
// socket.
const maxPeerBuckets = 4096

// pacing is one accept loop's buckets; only its loop uses it.
type pacing struct {
	socket *rate.Limiter
	// users and cgroups are nil on a container's own socket.
	users   *buckets[int]
	cgroups *buckets[string]
}

func newPacing(l Limits, own bool) *pacing {
	if own {
		return &pacing{socket: rate.NewLimiter(rate.Limit(l.AcceptRate), l.AcceptBurst)}
	}
	return &pacing{socket: rate.NewLimiter(rate.Limit(l.SharedAcceptRate), l.MaxConns),
		users: newBuckets[int](l), cgroups: newBuckets[string](l)}
}

// paceQuantum is the shortest sleep of a paced accept loop: it wakes for
// a few accepts at a time (5 of the shared socket's 250 a second), not
// once per accept, for a wake-up costs the agent more than an accept
// closed at once. The rate is the bucket's all the same.
const paceQuantum = 20 * time.Millisecond

// wait takes the socket's next accept, sleeping until it is due.
func (p *pacing) wait(m *metrics.Metrics) {
	if d := p.socket.Reserve().Delay(); d > 0 {
		m.Error(metrics.AcceptPaced)
		time.Sleep(max(d, paceQuantum))
	}
}

// buckets are the accept buckets of one kind of peer.
type buckets[K comparable] struct {
	rate  rate.Limit
	burst int
	m     map[K]*rate.Limiter
	// rest is the one bucket of the peers beyond maxPeerBuckets.
	rest *rate.Limiter
	// swept is when full buckets were last dropped: at most once per
	// refill, so that a spray costs one sweep per refill, not per accept.
	swept time.Time
}

func newBuckets[K comparable](l Limits) *buckets[K] {
	r := rate.Limit(l.AcceptRate)
	return &buckets[K]{rate: r, burst: l.AcceptBurst, m: map[K]*rate.Limiter{}, rest: rate.NewLimiter(r, l.AcceptBurst)}
}

// allow takes one accept from k's bucket; false: it is empty.
func (b *buckets[K]) allow(k K, now time.Time) bool {
	l := b.m[k]
	if l == nil {
		if len(b.m) >= maxPeerBuckets {
			b.sweep(now)
		}
		if len(b.m) >= maxPeerBuckets {
			return b.rest.AllowN(now, 1)
		}
		l = rate.NewLimiter(b.rate, b.burst)
		b.m[k] = l
	}
	return l.AllowN(now, 1)
}

// sweep drops the buckets that are full again: a new one is the same.
func (b *buckets[K]) sweep(now time.Time) {
	refill := time.Duration(float64(b.burst) / float64(b.rate) * float64(time.Second))
	if now.Sub(b.swept) < refill {
		return
	}
	b.swept = now
	for k, l := range b.m {
		if l.TokensAt(now) >= float64(b.burst) {
			delete(b.m, k)
		}
	}
}

// turns is a rate.Limiter that callers on many goroutines share: a
// container's paces, a process's HOLD_LIST. x/time/rate takes each
// caller's time as read before its lock and sets its clock to it, back as
// well as forward: a caller preempted between the two (on a loaded node,
// for milliseconds) moves the clock back, and the next caller is credited
// that interval again. turns reads the time under a lock of its own, so the
// clock only moves forward and the rate holds however busy the node is.
type turns struct {
	mu sync.Mutex
	l  *rate.Limiter
}

func newTurns(r rate.Limit, burst int) *turns {
	return &turns{l: rate.NewLimiter(r, burst)}
}

// allow takes a turn if one is due now.
func (t *turns) allow() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.l.AllowN(time.Now(), 1)
}

// wait takes a turn, sleeping until it is due. An error: ctx ended first,
// and the turn is given back.
func (t *turns) wait(ctx context.Context) error {
	t.mu.Lock()
	now := time.Now()
	r := t.l.ReserveN(now, 1)
	t.mu.Unlock()
	d := r.DelayFrom(now)
	if d == 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		t.mu.Lock()
		r.CancelAt(time.Now())
		t.mu.Unlock()
		return ctx.Err()
	}
}
