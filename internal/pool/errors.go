package pool

import (
	"fmt"
	"time"
)

// Reason says why the pool refused or failed a request. The server maps
// each to a wire code; the pool speaks no protocol.
type Reason uint8

const (
	// Internal: a cgroup operation failed.
	Internal Reason = iota
	// InvalidQuota: a quota outside what the pool serves.
	InvalidQuota
	// BadThread: the thread cannot be resolved or is not the peer's.
	BadThread
	// Rejected: admission refused the request.
	Rejected
	// Timeout: no budget freed up within the request's wait, or the
	// request was cancelled.
	Timeout
	// NoSlot: no slot freed up within the request's wait, or the kernel
	// refused a new one; worth retrying.
	NoSlot
	// UnknownLease: a lease or slot that is not the caller's.
	UnknownLease
	// Closing: the pool is closing, or its container is gone.
	Closing
	// BadRequest: a request the pool does not serve as asked (a HOLD
	// lease with a thread, or where the mode grants none).
	BadRequest
)

var reasonNames = [...]string{"internal", "invalid quota", "bad thread", "rejected", "timeout", "no slot", "unknown lease", "closing", "bad request"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Error is a typed pool failure.
type Error struct {
	Reason Reason
	// RetryAfter, when set, is when a retry may succeed.
	RetryAfter time.Duration
	Message    string
}

func (e *Error) Error() string { return e.Reason.String() + ": " + e.Message }

// Is lets errors.Is match on the reason alone (ErrInvalidQuota, ...).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Reason == e.Reason && t.Message == ""
}

// Sentinels for errors.Is.
var (
	ErrInternal     = &Error{Reason: Internal}
	ErrInvalidQuota = &Error{Reason: InvalidQuota}
	ErrBadThread    = &Error{Reason: BadThread}
	ErrRejected     = &Error{Reason: Rejected}
	ErrTimeout      = &Error{Reason: Timeout}
	ErrNoSlot       = &Error{Reason: NoSlot}
	ErrUnknownLease = &Error{Reason: UnknownLease}
	ErrClosing      = &Error{Reason: Closing}
	ErrBadRequest   = &Error{Reason: BadRequest}
)

func errorf(r Reason, format string, args ...any) *Error {
	return &Error{Reason: r, Message: fmt.Sprintf(format, args...)}
}
