package client

import "errors"

// Errors a caller can test for with errors.Is. The agent's refusals are
// *slotv1.Error: errors.Is(err, &slotv1.Error{Code: slotv1.CodeRejected})
// matches on the code, errors.As gives the message and retry hint. A
// cancelled or expired context is returned as the context's error
// (context.Canceled, context.DeadlineExceeded).
var (
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("cpuslot: client closed")
	// ErrUnreachable: the agent could not be reached, also after a
	// reconnect within Options.ReconnectFor; the cause is wrapped.
	ErrUnreachable = errors.New("cpuslot: agent unreachable")
	// ErrLeaseLost: a lease could not be re-declared to a restarted agent;
	// its usage is unknown.
	ErrLeaseLost = errors.New("cpuslot: lease lost across an agent restart")
	// ErrReleased: the lease was released already.
	ErrReleased = errors.New("cpuslot: lease released")
)
