// Package slotv1 encodes and decodes the cpuslot slot protocol, version 1.
// SPEC.md in this directory is the contract; testdata/vectors.json pins the
// bytes so that every implementation agrees.
package slotv1

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Version is the protocol version this package speaks.
const Version = 1

// Frame limits.
const (
	HeaderLen    = 4         // the length prefix
	MinBodyLen   = 6         // version, type, request id
	MaxBodyLen   = 64 * 1024 // larger frames are refused
	MaxStringLen = 1024
	// MaxUsageRecords bounds the records of one USAGE.
	MaxUsageRecords = 8
	// usageRecordLen is the longest USAGE record (action at MaxStringLen).
	usageRecordLen = 2 + MaxStringLen + 1 + 4 + 8 + 8
	// MaxRequestLen is the longest body of any request a client sends
	// (USAGE with MaxUsageRecords records whose actions are MaxStringLen
	// long); an agent refuses longer request frames without buffering them.
	MaxRequestLen = MinBodyLen + 1 + MaxUsageRecords*usageRecordLen
	// MaxHeldLeases bounds the leases one HELD_OK lists.
	MaxHeldLeases = 1024
	// MaxHelloLen is the longest HELLO body: all an agent buffers before
	// it knows its peer.
	MaxHelloLen = MinBodyLen + 6 + 2 + MaxStringLen
)

// Message types.
const (
	TypeHello     = 0x01
	TypeAcquire   = 0x02
	TypeRelease   = 0x03
	TypeReclaim   = 0x04
	TypeUsage     = 0x05
	TypeHeld      = 0x06
	TypeHelloOK   = 0x81
	TypeAcquireOK = 0x82
	TypeReleaseOK = 0x83
	TypeHeldOK    = 0x86
	TypeError     = 0x7F
)

// Flags and enumerations.
const (
	HelloFDPassing = 1 << 0
	HelloLocal     = 1 << 1

	HelloOKFavorDynMods = 1 << 0
	HelloOKAgentPlaces  = 1 << 1
	HelloOKLocal        = 1 << 2
	HelloOKHeld         = 1 << 3
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

	HeldDegraded = 1 << 1
)

// Outcome says how a slot was found for an acquisition.
type Outcome uint8

const (
	OutcomeAffinityHit Outcome = 1
	OutcomeCacheHit    Outcome = 2
	OutcomeRetuned     Outcome = 3
	OutcomeCreated     Outcome = 4
)

func (o Outcome) String() string {
	switch o {
	case OutcomeAffinityHit:
		return "affinity_hit"
	case OutcomeCacheHit:
		return "cache_hit"
	case OutcomeRetuned:
		return "retuned"
	case OutcomeCreated:
		return "created"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

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

func (o ReleaseOutcome) String() string {
	switch o {
	case InvocationOK:
		return "ok"
	case InvocationFailed:
		return "failed"
	case InvocationTimeout:
		return "timeout"
	case PlacementFailed:
		return "placement_failed"
	}
	return fmt.Sprintf("release(%d)", uint8(o))
}

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

func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("CODE_%d", uint16(c))
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

// HeldRequest (HELD) asks which HOLD leases the process holds and how much it should
// give back (local leasing). It has no payload.
type HeldRequest struct{}

// HeldOK (HELD_OK) answers HeldRequest.
type HeldOK struct {
	// BudgetMilli is the container's admission budget now (0: unlimited).
	BudgetMilli uint32
	// GiveBackMilli is how much of its held quota the process should give
	// back (RELEASE free held slots, least recently used first) so that
	// the container's granted total fits the budget again.
	GiveBackMilli uint32
	// Leases are the process's HOLD leases and what each is granted now
	// (at most MaxHeldLeases).
	Leases []HeldLease
}

// HeldLease is one HOLD lease in HeldOK.
type HeldLease struct {
	Lease      uint64
	Slot       uint32
	QuotaMilli uint32
	Flags      uint8 // HeldDegraded
}

// heldLeaseLen is the wire size of a HeldLease.
const heldLeaseLen = 8 + 4 + 4 + 1

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

func (*Hello) msgType() uint8       { return TypeHello }
func (*HelloOK) msgType() uint8     { return TypeHelloOK }
func (*Acquire) msgType() uint8     { return TypeAcquire }
func (*AcquireOK) msgType() uint8   { return TypeAcquireOK }
func (*Release) msgType() uint8     { return TypeRelease }
func (*ReleaseOK) msgType() uint8   { return TypeReleaseOK }
func (*Reclaim) msgType() uint8     { return TypeReclaim }
func (*Usage) msgType() uint8       { return TypeUsage }
func (*HeldRequest) msgType() uint8 { return TypeHeld }
func (*HeldOK) msgType() uint8      { return TypeHeldOK }
func (*Error) msgType() uint8       { return TypeError }

// Frame is a decoded frame: its request id and message.
type Frame struct {
	Request uint32
	Msg     Message
}

// ErrTooLarge is returned for a length prefix above MaxBodyLen.
var ErrTooLarge = errors.New("frame larger than 65536 bytes")

// Append encodes one frame (length prefix included) onto buf.
func Append(buf []byte, request uint32, m Message) ([]byte, error) {
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0, Version, m.msgType())
	buf = binary.BigEndian.AppendUint32(buf, request)
	var err error
	switch m := m.(type) {
	case *Hello:
		buf = append(buf, m.MinVersion, m.MaxVersion)
		buf = binary.BigEndian.AppendUint32(buf, m.Flags)
		buf, err = appendString(buf, m.Client)
	case *HelloOK:
		buf = append(buf, m.Version, m.Hierarchy)
		buf = binary.BigEndian.AppendUint32(buf, m.Flags)
		buf = append(buf, m.PlaceFDs, m.StatFDs)
		if buf, err = appendString(buf, m.Container); err != nil {
			return nil, err
		}
		buf = binary.BigEndian.AppendUint32(buf, m.BudgetMilli)
		if len(m.Pools) > 0xFFFF {
			return nil, errors.New("too many pools")
		}
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(m.Pools)))
		for _, p := range m.Pools {
			buf = binary.BigEndian.AppendUint32(buf, p.QuotaMilli)
			buf = binary.BigEndian.AppendUint32(buf, p.PeriodUS)
			buf = binary.BigEndian.AppendUint16(buf, p.Slots)
			buf = binary.BigEndian.AppendUint16(buf, p.Free)
		}
	case *Acquire:
		buf = binary.BigEndian.AppendUint32(buf, m.QuotaMilli)
		buf = binary.BigEndian.AppendUint32(buf, m.WaitUS)
		buf = binary.BigEndian.AppendUint32(buf, m.TID)
		buf = append(buf, m.Flags)
		buf = binary.BigEndian.AppendUint32(buf, m.CurrentSlot)
		if buf, err = appendString(buf, m.Action); err != nil {
			return nil, err
		}
		buf, err = appendString(buf, m.Invocation)
	case *AcquireOK:
		buf = binary.BigEndian.AppendUint64(buf, m.Lease)
		buf = binary.BigEndian.AppendUint32(buf, m.Slot)
		buf = binary.BigEndian.AppendUint32(buf, m.QuotaMilli)
		buf = binary.BigEndian.AppendUint32(buf, m.PeriodUS)
		buf = append(buf, uint8(m.Outcome), m.Flags, uint8(m.Place), m.NumFDs)
	case *Release:
		buf = binary.BigEndian.AppendUint64(buf, m.Lease)
		buf = append(buf, uint8(m.Outcome), m.Flags)
	case *ReleaseOK:
		buf = binary.BigEndian.AppendUint64(buf, m.CPUNanos)
		buf = binary.BigEndian.AppendUint64(buf, m.ThrottledNanos)
		buf = binary.BigEndian.AppendUint64(buf, m.Periods)
		buf = binary.BigEndian.AppendUint64(buf, m.ThrottledPeriods)
	case *Reclaim:
		buf = binary.BigEndian.AppendUint32(buf, m.Slot)
		buf = binary.BigEndian.AppendUint32(buf, m.QuotaMilli)
		buf = binary.BigEndian.AppendUint32(buf, m.TID)
		if buf, err = appendString(buf, m.Action); err != nil {
			return nil, err
		}
		buf, err = appendString(buf, m.Invocation)
	case *Usage:
		if n := len(m.Records); n < 1 || n > MaxUsageRecords {
			return nil, fmt.Errorf("usage with %d records, want 1..%d", n, MaxUsageRecords)
		}
		buf = append(buf, uint8(len(m.Records)))
		for _, u := range m.Records {
			if err = u.check(); err != nil {
				return nil, err
			}
			if buf, err = appendString(buf, u.Action); err != nil {
				return nil, err
			}
			buf = append(buf, uint8(u.Outcome))
			buf = binary.BigEndian.AppendUint32(buf, u.Invocations)
			buf = binary.BigEndian.AppendUint64(buf, u.CPUNanos)
			buf = binary.BigEndian.AppendUint64(buf, u.ThrottledNanos)
		}
	case *HeldRequest:
	case *HeldOK:
		if len(m.Leases) > MaxHeldLeases {
			return nil, fmt.Errorf("held_ok with %d leases, at most %d", len(m.Leases), MaxHeldLeases)
		}
		buf = binary.BigEndian.AppendUint32(buf, m.BudgetMilli)
		buf = binary.BigEndian.AppendUint32(buf, m.GiveBackMilli)
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(m.Leases)))
		for _, l := range m.Leases {
			buf = binary.BigEndian.AppendUint64(buf, l.Lease)
			buf = binary.BigEndian.AppendUint32(buf, l.Slot)
			buf = binary.BigEndian.AppendUint32(buf, l.QuotaMilli)
			buf = append(buf, l.Flags)
		}
	case *Error:
		buf = binary.BigEndian.AppendUint16(buf, uint16(m.Code))
		buf = binary.BigEndian.AppendUint32(buf, m.RetryAfterMS)
		buf, err = appendString(buf, truncate(Clean(m.Message), MaxStringLen))
	default:
		return nil, fmt.Errorf("unknown message %T", m)
	}
	if err != nil {
		return nil, err
	}
	body := len(buf) - start - HeaderLen
	if body > MaxBodyLen {
		return nil, ErrTooLarge
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(body))
	return buf, nil
}

func appendString(buf []byte, s string) ([]byte, error) {
	if len(s) > MaxStringLen {
		return nil, fmt.Errorf("string of %d bytes exceeds %d", len(s), MaxStringLen)
	}
	if err := CheckString(s); err != nil {
		return nil, err
	}
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(s)))
	return append(buf, s...), nil
}

// CheckString reports why s may not travel as a protocol string: every
// string is valid UTF-8 without control characters (C0, DEL, C1), so that
// names and ids are safe in logs, metric labels and file names.
func CheckString(s string) error {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n <= 1 {
				return fmt.Errorf("invalid UTF-8 at byte %d", i)
			}
		}
		if unicode.IsControl(r) {
			return fmt.Errorf("control character %U at byte %d", r, i)
		}
	}
	return nil
}

// Clean makes s a valid protocol string: invalid UTF-8 becomes U+FFFD and
// control characters become '?'. Agents use it for text they did not make
// themselves (error messages quoting a path, a container's cgroup name).
func Clean(s string) string {
	if CheckString(s) == nil {
		return s
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// BodyLen reads a frame's length prefix and checks its bounds.
func BodyLen(prefix []byte) (int, error) {
	n := binary.BigEndian.Uint32(prefix)
	if n > MaxBodyLen {
		return 0, ErrTooLarge
	}
	if n < MinBodyLen {
		return 0, Errorf(CodeBadRequest, "frame body of %d bytes is shorter than its header", n)
	}
	return int(n), nil
}

// DecodeBody decodes a frame body (everything after the length prefix).
// Errors are *Error values carrying the code to answer with.
func DecodeBody(body []byte) (Frame, error) {
	if len(body) < MinBodyLen {
		return Frame{}, Errorf(CodeBadRequest, "frame body of %d bytes is shorter than its header", len(body))
	}
	if body[0] != Version {
		return Frame{}, Errorf(CodeUnsupportedVersion, "frame version %d, this peer speaks %d", body[0], Version)
	}
	r := reader{b: body[6:]}
	f := Frame{Request: binary.BigEndian.Uint32(body[2:6])}
	switch t := body[1]; t {
	case TypeHello:
		m := &Hello{MinVersion: r.u8(), MaxVersion: r.u8(), Flags: r.u32(), Client: r.str()}
		f.Msg = m
	case TypeHelloOK:
		m := &HelloOK{Version: r.u8(), Hierarchy: r.u8(), Flags: r.u32(), PlaceFDs: r.u8(), StatFDs: r.u8(), Container: r.str(), BudgetMilli: r.u32()}
		n := int(r.u16())
		if r.err == nil && n*12 > len(r.b) {
			r.fail("pool count %d exceeds payload", n)
		}
		for i := 0; i < n && r.err == nil; i++ {
			m.Pools = append(m.Pools, PoolSummary{QuotaMilli: r.u32(), PeriodUS: r.u32(), Slots: r.u16(), Free: r.u16()})
		}
		f.Msg = m
	case TypeAcquire:
		f.Msg = &Acquire{QuotaMilli: r.u32(), WaitUS: r.u32(), TID: r.u32(), Flags: r.u8(), CurrentSlot: r.u32(), Action: r.str(), Invocation: r.str()}
	case TypeAcquireOK:
		f.Msg = &AcquireOK{Lease: r.u64(), Slot: r.u32(), QuotaMilli: r.u32(), PeriodUS: r.u32(),
			Outcome: Outcome(r.u8()), Flags: r.u8(), Place: Place(r.u8()), NumFDs: r.u8()}
	case TypeRelease:
		f.Msg = &Release{Lease: r.u64(), Outcome: ReleaseOutcome(r.u8()), Flags: r.u8()}
	case TypeReleaseOK:
		f.Msg = &ReleaseOK{CPUNanos: r.u64(), ThrottledNanos: r.u64(), Periods: r.u64(), ThrottledPeriods: r.u64()}
	case TypeReclaim:
		f.Msg = &Reclaim{Slot: r.u32(), QuotaMilli: r.u32(), TID: r.u32(), Action: r.str(), Invocation: r.str()}
	case TypeUsage:
		m := &Usage{}
		n := int(r.u8())
		if r.err == nil && (n < 1 || n > MaxUsageRecords) {
			r.fail("usage with %d records, want 1..%d", n, MaxUsageRecords)
		}
		for i := 0; i < n && r.err == nil; i++ {
			u := UsageRecord{Action: r.str(), Outcome: ReleaseOutcome(r.u8()), Invocations: r.u32(), CPUNanos: r.u64(), ThrottledNanos: r.u64()}
			if r.err == nil {
				if err := u.check(); err != nil {
					r.fail("record %d: %v", i, err)
				}
			}
			m.Records = append(m.Records, u)
		}
		f.Msg = m
	case TypeHeld:
		f.Msg = &HeldRequest{}
	case TypeHeldOK:
		m := &HeldOK{BudgetMilli: r.u32(), GiveBackMilli: r.u32()}
		n := int(r.u16())
		if r.err == nil && n > MaxHeldLeases {
			r.fail("held_ok with %d leases, at most %d", n, MaxHeldLeases)
		}
		if r.err == nil && n*heldLeaseLen > len(r.b) {
			r.fail("lease count %d exceeds payload", n)
		}
		for i := 0; i < n && r.err == nil; i++ {
			m.Leases = append(m.Leases, HeldLease{Lease: r.u64(), Slot: r.u32(), QuotaMilli: r.u32(), Flags: r.u8()})
		}
		f.Msg = m
	case TypeError:
		f.Msg = &Error{Code: Code(r.u16()), RetryAfterMS: r.u32(), Message: r.str()}
	default:
		return Frame{}, Errorf(CodeBadRequest, "unknown message type 0x%02x", t)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return Frame{}, Errorf(CodeBadRequest, "type 0x%02x: %v", body[1], r.err)
	}
	return f, nil
}

// reader consumes big-endian fields and remembers the first error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.fail("truncated payload")
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() uint8 {
	if v := r.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (r *reader) str() string {
	n := int(r.u16())
	if r.err == nil && n > MaxStringLen {
		r.fail("string of %d bytes exceeds %d", n, MaxStringLen)
		return ""
	}
	v := string(r.take(n))
	if r.err == nil {
		if err := CheckString(v); err != nil {
			r.fail("string: %v", err)
			return ""
		}
	}
	return v
}
