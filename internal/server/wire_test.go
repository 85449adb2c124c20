package server

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/outcome"
	"github.com/cpuslot/cpuslot/internal/pool"
)

// TestPoolErrorsOnTheWire: every reason the pool gives has its own wire
// code, and the message and retry hint reach the client unchanged.
func TestPoolErrorsOnTheWire(t *testing.T) {
	want := map[pool.Reason]slotv1.Code{
		pool.Internal:     slotv1.CodeInternal,
		pool.InvalidQuota: slotv1.CodeInvalidQuota,
		pool.BadThread:    slotv1.CodeBadRequest,
		pool.Rejected:     slotv1.CodeRejected,
		pool.Timeout:      slotv1.CodeTimeout,
		pool.NoSlot:       slotv1.CodeSlotUnavailable,
		pool.UnknownLease: slotv1.CodeUnknownLease,
		pool.Closing:      slotv1.CodeShuttingDown,
		pool.BadRequest:   slotv1.CodeBadRequest,
	}
	for r := range pool.Reason(255) {
		if strings.HasPrefix(r.String(), "reason(") {
			continue
		}
		if _, ok := want[r]; !ok {
			t.Errorf("pool reason %v has no expected wire code in this test", r)
		}
	}
	for r, code := range want {
		err := fmt.Errorf("wrapped: %w", &pool.Error{Reason: r, RetryAfter: 100 * time.Millisecond, Message: "m"})
		we := wireError(err)
		if we.Code != code || we.Message != "m" || we.RetryAfterMS != 100 {
			t.Errorf("%v: got %+v, want code %v", r, we, code)
		}
	}
	if we := wireError(errors.New("plain")); we.Code != slotv1.CodeInternal {
		t.Errorf("untyped error: %+v", we)
	}
	pe := slotv1.Errorf(slotv1.CodeNotReady, "later")
	if we := wireError(pe); we != pe {
		t.Errorf("wire error changed: %+v", we)
	}
	// A Resolver's refusals, wrapped or not.
	if we := wireError(fmt.Errorf("hello: %w", &NotServed{Reason: "not ours"})); we.Code != slotv1.CodeNotServed || we.Message != "not ours" {
		t.Errorf("NotServed: %+v", we)
	}
	if we := wireError(&NotReady{Reason: "full", RetryAfter: time.Second}); we.Code != slotv1.CodeNotReady || we.RetryAfterMS != 1000 || we.Message != "full" {
		t.Errorf("NotReady: %+v", we)
	}
}

// TestGrantOnTheWire: every acquisition outcome and placement the pool
// reports has a wire value, and every release outcome a client may send is
// counted as a known ending.
func TestGrantOnTheWire(t *testing.T) {
	for _, a := range outcome.Acquisitions {
		if _, ok := outcomes[a]; !ok {
			t.Errorf("acquisition %q has no wire outcome", a)
		}
	}
	for _, p := range []pool.Place{pool.PlaceNone, pool.PlaceSelf, pool.PlaceDone} {
		if _, ok := places[p]; !ok {
			t.Errorf("place %d has no wire value", p)
		}
	}
	for o := range slotv1.ReleaseOutcome(255) {
		e := ending(o)
		if strings.HasPrefix(o.String(), "release(") {
			if e != outcome.EndUnknown {
				t.Errorf("unknown outcome %d counted as %q", o, e)
			}
		} else if string(e) != o.String() {
			t.Errorf("outcome %v counted as %q", o, e)
		}
	}
}
