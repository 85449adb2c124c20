package slotv1

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/vectors.json and testdata/table.json from the tables in the tests")

// vector is one entry of testdata/vectors.json. Fields holds the message with
// the Go field names; other implementations map them to their own.
type vector struct {
	Name    string          `json:"name"`
	Type    string          `json:"type"`
	Request uint32          `json:"request"`
	Fields  json.RawMessage `json:"fields"`
	Hex     string          `json:"hex"`
}

type invalidVector struct {
	Name  string `json:"name"`
	Hex   string `json:"hex"`
	Error string `json:"error"`
}

type vectorFile struct {
	Comment string          `json:"comment"`
	Valid   []vector        `json:"valid"`
	Invalid []invalidVector `json:"invalid"`
}

var typeNames = map[uint8]string{
	TypeHello: "HELLO", TypeHelloOK: "HELLO_OK", TypeAcquire: "ACQUIRE", TypeAcquireOK: "ACQUIRE_OK",
	TypeRelease: "RELEASE", TypeReleaseOK: "RELEASE_OK", TypeReclaim: "RECLAIM", TypeUsage: "USAGE", TypeError: "ERROR",
	TypeHoldList: "HOLD_LIST", TypeHoldListOK: "HOLD_LIST_OK",
}

func newMessage(typ string) Message {
	switch typ {
	case "HELLO":
		return &Hello{}
	case "HELLO_OK":
		return &HelloOK{}
	case "ACQUIRE":
		return &Acquire{}
	case "ACQUIRE_OK":
		return &AcquireOK{}
	case "RELEASE":
		return &Release{}
	case "RELEASE_OK":
		return &ReleaseOK{}
	case "RECLAIM":
		return &Reclaim{}
	case "USAGE":
		return &Usage{}
	case "HOLD_LIST":
		return &HoldListRequest{}
	case "HOLD_LIST_OK":
		return &HoldListOK{}
	case "ERROR":
		return &Error{}
	}
	return nil
}

var table = []struct {
	name    string
	request uint32
	msg     Message
}{
	{"hello", 1, &Hello{MinVersion: 1, MaxVersion: 1, Flags: HelloFDPassing, Client: "java"}},
	{"hello_no_fds", 2, &Hello{MinVersion: 1, MaxVersion: 1, Client: ""}},
	{"hello_ok_v2", 1, &HelloOK{Version: 1, Hierarchy: 2, Flags: HelloOKFavorDynMods, PlaceFDs: 1, StatFDs: 1, Container: "default/fn-7f9c/user-action", BudgetMilli: 2000,
		Pools: []PoolSummary{{QuotaMilli: 250, PeriodUS: 100000, Slots: 8, Free: 7}, {QuotaMilli: 1000, PeriodUS: 100000, Slots: 2, Free: 2}}}},
	{"hello_ok_v1_no_pools", 9, &HelloOK{Version: 1, Hierarchy: 1, Flags: HelloOKAgentPlaces, PlaceFDs: 2, StatFDs: 2, Container: "/cpuslot-demo/runtime"}},
	{"acquire", 7, &Acquire{QuotaMilli: 250, WaitUS: 50000, TID: 4242, CurrentSlot: 12, Action: "guest/fib", Invocation: "a1b2c3"}},
	{"acquire_agent_places_unicode", 8, &Acquire{QuotaMilli: 1500, TID: 1, Flags: AcquireAgentPlaces, Action: "gäst/ƒib☃", Invocation: ""}},
	{"acquire_ok_self", 7, &AcquireOK{Lease: 0x0102030405060708, Slot: 12, QuotaMilli: 250, PeriodUS: 100000, Outcome: OutcomeCacheHit, Place: PlaceSelf, NumFDs: 1}},
	{"acquire_ok_affinity", 10, &AcquireOK{Lease: 99, Slot: 12, QuotaMilli: 250, PeriodUS: 100000, Outcome: OutcomeAffinityHit, Place: PlaceNone}},
	{"acquire_ok_degraded_queued", 11, &AcquireOK{Lease: 100, Slot: 3, QuotaMilli: 100, PeriodUS: 50000, Outcome: OutcomeRetuned, Flags: AcquiredQueued | AcquiredDegraded, Place: PlaceDone, NumFDs: 2}},
	{"release", 12, &Release{Lease: 99, Outcome: InvocationOK}},
	{"release_no_reply", 16, &Release{Lease: 100, Outcome: InvocationFailed, Flags: ReleaseNoReply}},
	{"release_placement_failed", 13, &Release{Lease: 1 << 63, Outcome: PlacementFailed}},
	{"release_ok", 12, &ReleaseOK{CPUNanos: 24_999_000, ThrottledNanos: 75_000_000, Periods: 10, ThrottledPeriods: 9}},
	{"reclaim", 14, &Reclaim{Slot: 12, QuotaMilli: 250, TID: 4242, Action: "guest/fib", Invocation: "a1b2c3"}},
	{"hello_local", 3, &Hello{MinVersion: 1, MaxVersion: 1, Flags: HelloFDPassing | HelloLocal, Client: "go"}},
	{"hello_ok_local", 3, &HelloOK{Version: 1, Hierarchy: 2, Flags: HelloOKLocal, PlaceFDs: 1, StatFDs: 1, Container: "default/fn/user-action", BudgetMilli: 1000}},
	{"acquire_hold", 17, &Acquire{QuotaMilli: 333, WaitUS: 20000, Flags: AcquireHold}},
	{"reclaim_hold", 18, &Reclaim{Slot: 7, QuotaMilli: 333}},
	{"usage", 19, &Usage{Records: []UsageRecord{
		{Action: "guest/fib", Outcome: InvocationOK, Invocations: 41, CPUNanos: 1_230_000_000, ThrottledNanos: 4_500_000},
		{Action: "gäst/ƒib☃", Outcome: InvocationTimeout, Invocations: 1, CPUNanos: 100_000_000, ThrottledNanos: 0}}}},
	{"hello_ok_local_hold_list", 4, &HelloOK{Version: 1, Hierarchy: 1, Flags: HelloOKLocal | HelloOKHoldList, PlaceFDs: 1, StatFDs: 2, Container: "default/fn/user-action", BudgetMilli: 400}},
	{"hold_list", 20, &HoldListRequest{}},
	{"hold_list_ok_give_back", 20, &HoldListOK{BudgetMilli: 400, GiveBackMilli: 100, Leases: []HoldLease{
		{Lease: 0x0102030405060708, Slot: 7, QuotaMilli: 250}, {Lease: 9, Slot: 12, QuotaMilli: 150, Flags: HoldDegraded}}}},
	{"hold_list_ok_none", 21, &HoldListOK{}},
	{"error_rejected", 15, &Error{Code: CodeRejected, Message: "quota 1500m does not fit: 500m of 2000m free"}},
	{"error_not_ready", 1, &Error{Code: CodeNotReady, RetryAfterMS: 200, Message: "pool is being prepared"}},
	{"hello_ok_lend", 5, &HelloOK{Version: 1, Hierarchy: 2, Flags: HelloOKLend, PlaceFDs: 1, StatFDs: 1, Container: "default/fn/user-action", BudgetMilli: 1000}},
	{"release_sleep", 22, &Release{Lease: 99, Outcome: InvocationOK, Flags: ReleaseSleep}},
	{"release_wake_no_reply", 23, &Release{Lease: 99, Outcome: InvocationOK, Flags: ReleaseWake | ReleaseNoReply}},
}

var invalidTable = []invalidVector{
	{"short_header", "00000003010102", "BAD_REQUEST"},
	{"wrong_version", "000000060201" + "00000001", "UNSUPPORTED_VERSION"},
	{"unknown_type", "000000060155" + "00000001", "BAD_REQUEST"},
	{"truncated_acquire", "0000000a0102" + "00000001" + "000000fa", "BAD_REQUEST"},
	{"trailing_bytes_release", "000000110103" + "00000001" + "0000000000000063" + "00" + "00" + "ff", "BAD_REQUEST"},
	{"string_past_end", "0000000e0101" + "00000001" + "010100000001" + "0010", "BAD_REQUEST"},
	{"string_too_long", "0000000e0101" + "00000001" + "010100000001" + "0401", "BAD_REQUEST"},
	{"oversized_frame", "00010001010100000001", "BAD_REQUEST"},
	{"action_invalid_utf8", "00000022010200000001000000fa00000000000000010000000000000767756573742fff0000", "BAD_REQUEST"},
	{"invocation_control_char", "00000027010200000001000000fa00000000000000010000000000000967756573742f6669620003610a62", "BAD_REQUEST"},
	{"action_c1_control", "0000001e010200000001000000fa000000000000000100000000000003c285780000", "BAD_REQUEST"},
	{"hello_client_nul", "0000001301010000000101010000000100056a61007661", "BAD_REQUEST"},
	{"usage_zero_records", "00000007" + "0105" + "00000001" + "00", "BAD_REQUEST"},
	{"usage_nine_records", "0000001f" + "0105" + "00000001" + "09" + "000161" + "00" + "00000001" + "0000000000000005" + "0000000000000000", "BAD_REQUEST"},
	{"usage_zero_invocations", "0000001f" + "0105" + "00000001" + "01" + "000161" + "00" + "00000000" + "0000000000000005" + "0000000000000000", "BAD_REQUEST"},
	{"usage_placement_failed", "0000001f" + "0105" + "00000001" + "01" + "000161" + "03" + "00000001" + "0000000000000005" + "0000000000000000", "BAD_REQUEST"},
	{"held_trailing_bytes", "00000007" + "0106" + "00000001" + "00", "BAD_REQUEST"},
	{"held_ok_lease_past_end", "00000021" + "0186" + "00000001" + "00000190" + "00000064" + "0002" + "0000000000000009" + "00000007" + "000000fa" + "00", "BAD_REQUEST"},
	{"held_ok_too_many_leases", "00000010" + "0186" + "00000001" + "00000190" + "00000064" + "0401", "BAD_REQUEST"},
	{"reclaim_surrogate", "000000180104000000010000000c000000fa000000010002eda00000", "BAD_REQUEST"},
}

func encodeHex(t *testing.T, request uint32, m Message) string {
	t.Helper()
	b, err := Append(nil, request, m)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return hex.EncodeToString(b)
}

// decodeFrame decodes a whole frame, length prefix included, as a peer would.
func decodeFrame(b []byte) (Frame, error) {
	if len(b) < HeaderLen {
		return Frame{}, Errorf(CodeBadRequest, "short frame")
	}
	n, err := BodyLen(b[:HeaderLen])
	if err != nil {
		if errors.Is(err, ErrTooLarge) {
			return Frame{}, Errorf(CodeBadRequest, "%v", err)
		}
		return Frame{}, err
	}
	if len(b)-HeaderLen != n {
		return Frame{}, Errorf(CodeBadRequest, "length prefix %d, body %d", n, len(b)-HeaderLen)
	}
	return DecodeBody(b[HeaderLen:])
}

func TestVectors(t *testing.T) {
	var file vectorFile
	if *update {
		file.Comment = "Generated by `go test ./api/slot/v1 -update`. Each valid vector: the message's fields (Go names) and the frame's bytes, length prefix included. Each invalid vector: bytes a decoder must refuse and the error code to answer."
		for _, v := range table {
			fields, _ := json.Marshal(v.msg)
			file.Valid = append(file.Valid, vector{Name: v.name, Type: typeNames[v.msg.msgType()], Request: v.request, Fields: fields, Hex: encodeHex(t, v.request, v.msg)})
		}
		file.Invalid = invalidTable
		out, _ := json.MarshalIndent(file, "", "  ")
		if err := os.WriteFile("testdata/vectors.json", append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile("testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Valid) != len(table) || len(file.Invalid) != len(invalidTable) {
		t.Fatalf("vectors.json is stale: run go test ./api/slot/v1 -update")
	}
	for _, v := range file.Valid {
		t.Run(v.Name, func(t *testing.T) {
			want := newMessage(v.Type)
			if err := json.Unmarshal(v.Fields, want); err != nil {
				t.Fatal(err)
			}
			if got := encodeHex(t, v.Request, want); got != v.Hex {
				t.Fatalf("encode\n got %s\nwant %s", got, v.Hex)
			}
			b, _ := hex.DecodeString(v.Hex)
			f, err := decodeFrame(b)
			if err != nil {
				t.Fatal(err)
			}
			if f.Request != v.Request || !reflect.DeepEqual(normalize(f.Msg), normalize(want)) {
				t.Fatalf("decode: got %+v want %+v", f.Msg, want)
			}
		})
	}
	for _, v := range file.Invalid {
		t.Run("invalid_"+v.Name, func(t *testing.T) {
			b, _ := hex.DecodeString(v.Hex)
			_, err := decodeFrame(b)
			var pe *Error
			if !errors.As(err, &pe) || pe.Code.String() != v.Error {
				t.Fatalf("got %v, want %s", err, v.Error)
			}
		})
	}
}

// normalize treats a nil and an empty pool list alike.
func normalize(m Message) Message {
	if h, ok := m.(*HelloOK); ok && len(h.Pools) == 0 {
		c := *h
		c.Pools = nil
		return &c
	}
	if h, ok := m.(*HoldListOK); ok && len(h.Leases) == 0 {
		c := *h
		c.Leases = nil
		return &c
	}
	return m
}

func TestEncodeRefusesOversizedString(t *testing.T) {
	_, err := Append(nil, 1, &Acquire{QuotaMilli: 1, Action: strings.Repeat("x", MaxStringLen+1)})
	if err == nil {
		t.Fatal("want error for a string above the limit")
	}
	// Error messages are cut, not refused, and stay valid UTF-8.
	b, err := Append(nil, 1, &Error{Code: CodeInternal, Message: strings.Repeat("é", MaxStringLen)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := decodeFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	if msg := f.Msg.(*Error).Message; len(msg) > MaxStringLen || !strings.HasPrefix(msg, "éé") || strings.ContainsRune(msg, 0xFFFD) {
		t.Fatalf("bad truncation: %d bytes", len(msg))
	}
}

func TestStrings(t *testing.T) {
	for _, s := range []string{"guest/\xff", "a\nb", "\x00", "\u0085", "\x7f", "\xed\xa0\x80"} {
		if CheckString(s) == nil {
			t.Errorf("%q accepted", s)
		}
		if _, err := Append(nil, 1, &Acquire{QuotaMilli: 250, Action: s}); err == nil {
			t.Errorf("encoder sent %q", s)
		}
		if c := Clean(s); CheckString(c) != nil {
			t.Errorf("Clean(%q) = %q still invalid", s, c)
		}
		// An error message quoting such a string is cleaned, not refused.
		b, err := Append(nil, 1, &Error{Code: CodeNotServed, Message: "cgroup /" + s})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeFrame(b); err != nil {
			t.Errorf("error message with %q: %v", s, err)
		}
	}
	for _, s := range []string{"", "guest/fib", "gäst/ƒib☃", "a b-c_d.e:f@g"} {
		if err := CheckString(s); err != nil || Clean(s) != s {
			t.Errorf("%q: %v", s, err)
		}
	}
}

// FuzzDecode checks that no input crashes the decoder and that whatever it
// accepts re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, v := range table {
		b, _ := Append(nil, v.request, v.msg)
		f.Add(b[HeaderLen:])
	}
	for _, v := range invalidTable {
		b, _ := hex.DecodeString(v.Hex)
		if len(b) > HeaderLen {
			f.Add(b[HeaderLen:])
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fr, err := DecodeBody(body)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		out, err := Append(nil, fr.Request, fr.Msg)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if !bytes.Equal(out[HeaderLen:], body) {
			t.Fatalf("round trip changed bytes\n in %x\nout %x", body, out[HeaderLen:])
		}
	})
}
