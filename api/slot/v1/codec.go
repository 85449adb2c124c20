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
	// MaxHoldListLeases bounds the leases one HOLD_LIST_OK lists.
	MaxHoldListLeases = 1024
	// MaxHelloLen is the longest HELLO body: all an agent buffers before
	// it knows its peer.
	MaxHelloLen = MinBodyLen + 6 + 2 + MaxStringLen
)

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
	case *HoldListRequest:
	case *HoldListOK:
		if len(m.Leases) > MaxHoldListLeases {
			return nil, fmt.Errorf("hold_list_ok with %d leases, at most %d", len(m.Leases), MaxHoldListLeases)
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
	case TypeHoldList:
		f.Msg = &HoldListRequest{}
	case TypeHoldListOK:
		m := &HoldListOK{BudgetMilli: r.u32(), GiveBackMilli: r.u32()}
		n := int(r.u16())
		if r.err == nil && n > MaxHoldListLeases {
			r.fail("hold_list_ok with %d leases, at most %d", n, MaxHoldListLeases)
		}
		if r.err == nil && n*holdLeaseLen > len(r.b) {
			r.fail("lease count %d exceeds payload", n)
		}
		for i := 0; i < n && r.err == nil; i++ {
			m.Leases = append(m.Leases, HoldLease{Lease: r.u64(), Slot: r.u32(), QuotaMilli: r.u32(), Flags: r.u8()})
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
