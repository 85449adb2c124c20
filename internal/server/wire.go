package server

import (
	"errors"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/outcome"
	"github.com/cpuslot/cpuslot/internal/pool"
)

// The one place where the pool's results become the wire's.

var reasonCodes = map[pool.Reason]slotv1.Code{
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

// wireError is err as the protocol's typed error; an error of no known type
// is internal.
func wireError(err error) *slotv1.Error {
	var we *slotv1.Error
	if errors.As(err, &we) {
		return we
	}
	var ns *NotServed
	if errors.As(err, &ns) {
		return &slotv1.Error{Code: slotv1.CodeNotServed, Message: ns.Reason}
	}
	var nr *NotReady
	if errors.As(err, &nr) {
		return &slotv1.Error{Code: slotv1.CodeNotReady, RetryAfterMS: uint32(nr.RetryAfter.Milliseconds()), Message: nr.Reason}
	}
	var pe *pool.Error
	if errors.As(err, &pe) {
		code, ok := reasonCodes[pe.Reason]
		if !ok {
			code = slotv1.CodeInternal
		}
		return &slotv1.Error{Code: code, RetryAfterMS: uint32(pe.RetryAfter.Milliseconds()), Message: pe.Message}
	}
	return slotv1.Errorf(slotv1.CodeInternal, "%v", err)
}

var outcomes = map[outcome.Acquisition]slotv1.Outcome{
	outcome.AffinityHit: slotv1.OutcomeAffinityHit,
	outcome.CacheHit:    slotv1.OutcomeCacheHit,
	outcome.Retuned:     slotv1.OutcomeRetuned,
	outcome.Created:     slotv1.OutcomeCreated,
	outcome.Reclaimed:   slotv1.OutcomeAffinityHit, // the thread sits in the slot
}

var places = map[pool.Place]slotv1.Place{
	pool.PlaceNone: slotv1.PlaceNone,
	pool.PlaceSelf: slotv1.PlaceSelf,
	pool.PlaceDone: slotv1.PlaceDone,
}

var endings = map[slotv1.ReleaseOutcome]outcome.Ending{
	slotv1.InvocationOK:      outcome.EndOK,
	slotv1.InvocationFailed:  outcome.EndFailed,
	slotv1.InvocationTimeout: outcome.EndTimeout,
	slotv1.PlacementFailed:   outcome.EndPlacementFailed,
}

// ending is how a client says its invocation ended; an outcome this agent
// does not know is counted as such, not as a label of the client's making.
func ending(o slotv1.ReleaseOutcome) outcome.Ending {
	if e, ok := endings[o]; ok {
		return e
	}
	return outcome.EndUnknown
}
