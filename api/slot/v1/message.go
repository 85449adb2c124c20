package slotv1

// The protocol's messages, their types, flags and enumerations, and its
// typed error: what codec.go encodes and decodes.

import (
	"errors"
	"fmt"
)

// Message types.
const (
	TypeHello      = 0x01
	TypeAcquire    = 0x02
	TypeRelease    = 0x03
	TypeReclaim    = 0x04
	TypeUsage      = 0x05
	TypeHoldList   = 0x06
	TypeHelloOK    = 0x81
	TypeAcquireOK  = 0x82
	TypeReleaseOK  = 0x83
	TypeHoldListOK = 0x86
	TypeError      = 0x7F
)

// Flags and enumerations.
const (
	HelloFDPassing = 1 << 0
	HelloLocal     = 1 << 1

	HelloOKFavorDynMods = 1 << 0
	HelloOKAgentPlaces  = 1 << 1
	HelloOKLocal        = 1 << 2
	HelloOKHoldList     = 1 << 3
	HelloOKLend         = 1 << 4

	AcquireAgentPlaces = 1 << 0
	AcquireHold        = 1 << 1

	AcquiredQueued   = 1 << 0
	AcquiredDegraded = 1 << 1

	ReleaseNoReply = 1 << 0
	// ReleaseSleep and ReleaseWake do not release: the lease's invocation
	// sleeps (waits on I/O) or woke up (SPEC.md, "Lending").
	ReleaseSleep = 1 << 1
	ReleaseWake  = 1 << 2

	HoldDegraded = 1 << 1
)

// Outcome says how a slot was found for an acquisition.
type Outcome uint8

const (
	OutcomeAffinityHit Outcome = 1
	OutcomeCacheHit    Outcome = 2
	OutcomeRetuned     Outcome = 3
	OutcomeCreated     Outcome = 4
)

var outcomeNames = map[Outcome]string{
	OutcomeAffinityHit: "affinity_hit",
	OutcomeCacheHit:    "cache_hit",
	OutcomeRetuned:     "retuned",
	OutcomeCreated:     "created",
}

func (o Outcome) String() string { return nameOf(outcomeNames, o, "outcome(%d)") }

// Place tells the client what to do after ACQUIRE_OK.
type Place uint8

const (
	PlaceNone Place = 0 // the thread already sits in the slot
	PlaceSelf Place = 1 // write "0" to each of the slot's fds
	PlaceDone Place = 2 // the agent placed the thread
)

// ReleaseOutcome is how an invocation ended, reported on RELEASE.
type ReleaseOutcome uint8

const (
	InvocationOK      ReleaseOutcome = 0
	InvocationFailed  ReleaseOutcome = 1
	InvocationTimeout ReleaseOutcome = 2
	PlacementFailed   ReleaseOutcome = 3
)

var releaseOutcomeNames = map[ReleaseOutcome]string{
	InvocationOK:      "ok",
	InvocationFailed:  "failed",
	InvocationTimeout: "timeout",
	PlacementFailed:   "placement_failed",
}

func (o ReleaseOutcome) String() string { return nameOf(releaseOutcomeNames, o, "release(%d)") }

// Code is a typed protocol error.
type Code uint16

const (
	CodeBadRequest         Code = 1
	CodeUnsupportedVersion Code = 2
	CodeNotServed          Code = 3
	CodeInvalidQuota       Code = 4
	CodeRejected           Code = 5
	CodeTimeout            Code = 6
	CodeUnknownLease       Code = 7
	CodeSlotUnavailable    Code = 8
	CodeInternal           Code = 9
	CodeShuttingDown       Code = 10
	CodeNotReady           Code = 11
)

var codeNames = map[Code]string{
	CodeBadRequest:         "BAD_REQUEST",
	CodeUnsupportedVersion: "UNSUPPORTED_VERSION",
	CodeNotServed:          "NOT_SERVED",
	CodeInvalidQuota:       "INVALID_QUOTA",
	CodeRejected:           "REJECTED",
	CodeTimeout:            "TIMEOUT",
	CodeUnknownLease:       "UNKNOWN_LEASE",
	CodeSlotUnavailable:    "SLOT_UNAVAILABLE",
	CodeInternal:           "INTERNAL",
	CodeShuttingDown:       "SHUTTING_DOWN",
	CodeNotReady:           "NOT_READY",
}

func (c Code) String() string { return nameOf(codeNames, c, "CODE_%d") }

// nameOf is v's name in names; a value it does not list is written with
// unknown, a format of one number.
func nameOf[T ~uint8 | ~uint16](names map[T]string, v T, unknown string) string {
	if n, ok := names[v]; ok {
		return n
	}
	return fmt.Sprintf(unknown, uint64(v))
}

// Message is any protocol message.
type Message interface{ msgType() uint8 }

// Hello opens a connection.
type Hello struct {
	MinVersion, MaxVersion uint8
	Flags                  uint32
	Client                 string
}

// PoolSummary describes the slots of one quota in HelloOK.
type PoolSummary struct {
	QuotaMilli uint32
	PeriodUS   uint32
	Slots      uint16
	Free       uint16
}

// HelloOK answers Hello.
type HelloOK struct {
	Version   uint8
	Hierarchy uint8
	Flags     uint32
	// PlaceFDs and StatFDs say how a slot's fds split: the first PlaceFDs
	// take "0" to place a thread, the next StatFDs read its counters.
	PlaceFDs    uint8
	StatFDs     uint8
	Container   string
	BudgetMilli uint32
	Pools       []PoolSummary
}

// Acquire asks for a slot.
type Acquire struct {
	QuotaMilli uint32
	WaitUS     uint32
	TID        uint32
	Flags      uint8
	// CurrentSlot is the slot the client last placed this thread in (0: none).
	CurrentSlot uint32
	Action      string
	Invocation  string
}

// AcquireOK grants a lease on a slot. Fds travel beside the frame.
type AcquireOK struct {
	Lease      uint64
	Slot       uint32
	QuotaMilli uint32
	PeriodUS   uint32
	Outcome    Outcome
	Flags      uint8
	Place      Place
	NumFDs     uint8
}

// Release gives a lease back.
type Release struct {
	Lease   uint64
	Outcome ReleaseOutcome
	Flags   uint8
}

// ReleaseOK reports what the slot used while leased.
type ReleaseOK struct {
	CPUNanos         uint64
	ThrottledNanos   uint64
	Periods          uint64
	ThrottledPeriods uint64
}

// Reclaim re-declares a lease held across a reconnect.
type Reclaim struct {
	Slot       uint32
	QuotaMilli uint32
	TID        uint32
	Action     string
	Invocation string
}

// Usage reports what invocations under HOLD leases used (one-way).
type Usage struct {
	Records []UsageRecord
}

// UsageRecord sums the invocations of one action that ended one way.
type UsageRecord struct {
	Action         string
	Outcome        ReleaseOutcome // InvocationOK, InvocationFailed or InvocationTimeout
	Invocations    uint32         // at least 1
	CPUNanos       uint64
	ThrottledNanos uint64
}

// check reports why the record may not travel.
func (u UsageRecord) check() error {
	if u.Outcome > InvocationTimeout {
		return fmt.Errorf("usage outcome %s is not ok, failed or timeout", u.Outcome)
	}
	if u.Invocations == 0 {
		return errors.New("usage record of 0 invocations")
	}
	return nil
}

// HoldListRequest (HOLD_LIST) asks which HOLD leases the process holds and how much it should
// give back (local leasing). It has no payload.
type HoldListRequest struct{}

// HoldListOK (HOLD_LIST_OK) answers HoldListRequest.
type HoldListOK struct {
	// BudgetMilli is the container's admission budget now (0: unlimited).
	BudgetMilli uint32
	// GiveBackMilli is how much of its held quota the process should give
	// back (RELEASE free held slots, least recently used first) so that
	// the container's granted total fits the budget again.
	GiveBackMilli uint32
	// Leases are the process's HOLD leases and what each is granted now
	// (at most MaxHoldListLeases).
	Leases []HoldLease
}

// HoldLease is one HOLD lease in HoldListOK.
type HoldLease struct {
	Lease      uint64
	Slot       uint32
	QuotaMilli uint32
	Flags      uint8 // HoldDegraded
}

// holdLeaseLen is the wire size of a HoldLease.
const holdLeaseLen = 8 + 4 + 4 + 1

// Error is a typed failure; it is also a Go error.
type Error struct {
	Code         Code
	RetryAfterMS uint32
	Message      string
}

func (e *Error) Error() string { return fmt.Sprintf("cpuslot %s: %s", e.Code, e.Message) }

// Is lets errors.Is match on the code alone.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Message == ""
}

// Errorf builds a protocol error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func (*Hello) msgType() uint8           { return TypeHello }
func (*HelloOK) msgType() uint8         { return TypeHelloOK }
func (*Acquire) msgType() uint8         { return TypeAcquire }
func (*AcquireOK) msgType() uint8       { return TypeAcquireOK }
func (*Release) msgType() uint8         { return TypeRelease }
func (*ReleaseOK) msgType() uint8       { return TypeReleaseOK }
func (*Reclaim) msgType() uint8         { return TypeReclaim }
func (*Usage) msgType() uint8           { return TypeUsage }
func (*HoldListRequest) msgType() uint8 { return TypeHoldList }
func (*HoldListOK) msgType() uint8      { return TypeHoldListOK }
func (*Error) msgType() uint8           { return TypeError }
