// Package health tells a stalled loop of the agent from an idle one, for
// /healthz: a loop marks the work it takes on (a maintenance round, an
// accepted connection, a pod to reconcile) and work that has not ended
// within a limit is a stall (a cgroup write that hangs, a lock never given
// back). Waiting for work (an accept, an empty queue) is not.
package health

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Loop is one loop's work in hand.
type Loop struct {
	// Name names the loop in /healthz and the log.
	Name string
	// since is when the work in hand began (Unix ns); 0: waiting for work.
	since atomic.Int64
}

// Begin marks work taken on.
func (l *Loop) Begin() { l.since.Store(time.Now().UnixNano()) }

// End marks that work done.
func (l *Loop) End() { l.since.Store(0) }

// Stalled names the loop when its work in hand began more than limit
// before now.
func (l *Loop) Stalled(now time.Time, limit time.Duration) error {
	s := l.since.Load()
	if s == 0 {
		return nil
	}
	if d := now.Sub(time.Unix(0, s)); d > limit {
		return fmt.Errorf("%s stalled: its work in hand began %v ago (limit %v)", l.Name, d.Round(time.Millisecond), limit)
	}
	return nil
}

// Checker is what has loops of its own (the server's accept loops, a
// source's workers): Stalled names each that is.
type Checker interface {
	Stalled(now time.Time, limit time.Duration) error
}
