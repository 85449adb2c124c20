package agenttest

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"

	"github.com/cpuslot/cpuslot/internal/agent"
	"golang.org/x/sys/unix"
)

// Frames and metrics: speaking to an agent as a raw peer.

func Scrape(t *testing.T, a *agent.Agent) string {
	t.Helper()
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// Grep keeps the lines of s that hold sub.
func Grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// DialRaw connects to the socket, for raw frames.
func DialRaw(t *testing.T, path string) net.Conn {
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c
}

// Frame encodes m as a frame of request 1.
func Frame(t testing.TB, m slotv1.Message) []byte {
	b, err := slotv1.Append(nil, 1, m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ReadResp reads and decodes one answer.
func ReadResp(t testing.TB, c net.Conn) slotv1.Message {
	t.Helper()
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatalf("reading response: %v", err)
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(c, body); err != nil {
		t.Fatal(err)
	}
	f, err := slotv1.DecodeBody(body)
	if err != nil {
		t.Fatal(err)
	}
	return f.Msg
}

// WantCode fails the test unless m is an ERROR with code.
func WantCode(t *testing.T, what string, m slotv1.Message, code slotv1.Code) {
	t.Helper()
	if pe, ok := m.(*slotv1.Error); !ok || pe.Code != code {
		t.Fatalf("%s: got %+v, want %v", what, m, code)
	}
}

// ReadRawFrame reads one frame and any fds that came with it.
func ReadRawFrame(c *net.UnixConn) ([]byte, []int, error) {
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(8*4))
	n, oobn, _, _, err := c.ReadMsgUnix(hdr[:1], oob)
	if err != nil || n == 0 {
		return nil, nil, errors.Join(err, io.ErrUnexpectedEOF)
	}
	var fds []int
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			f, _ := unix.ParseUnixRights(&m)
			fds = append(fds, f...)
		}
	}
	if _, err := io.ReadFull(c, hdr[1:]); err != nil {
		return nil, fds, err
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	_, err = io.ReadFull(c, body)
	return body, fds, err
}

// FrameBytes encodes m as a frame of request 1 (outside a test).
func FrameBytes(m slotv1.Message) []byte {
	b, err := slotv1.Append(nil, 1, m)
	if err != nil {
		panic(err)
	}
	return b
}

// ClosedByAgent tells a read that ended because the agent closed the
// connection (EOF, or a reset when unread data was left) from a timeout.
func ClosedByAgent(err error) bool {
	return err == nil || errors.Is(err, syscall.ECONNRESET)
}

// hello dials the socket and says HELLO, with or without fd passing.
func hello(t *testing.T, socket string, fds bool) net.Conn {
	t.Helper()
	c := DialRaw(t, socket)
	h := &slotv1.Hello{MinVersion: 1, MaxVersion: 1}
	if fds {
		h.Flags = slotv1.HelloFDPassing
	}
	c.Write(Frame(t, h))
	if m, ok := ReadResp(t, c).(*slotv1.HelloOK); !ok {
		t.Fatalf("hello refused: %+v", m)
	}
	return c
}

// SayHello says HELLO without fd passing on c.
func SayHello(t *testing.T, c net.Conn) {
	t.Helper()
	c.Write(Frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1}))
	if m, ok := ReadResp(t, c).(*slotv1.HelloOK); !ok {
		t.Fatalf("hello refused: %+v", m)
	}
}

// IsErr reports whether m is an ERROR with code.
func IsErr(m slotv1.Message, code slotv1.Code) bool {
	pe, ok := m.(*slotv1.Error)
	return ok && pe.Code == code
}

// IsOK reports whether m is a HELLO_OK.
func IsOK(m slotv1.Message) bool { _, ok := m.(*slotv1.HelloOK); return ok }

// ReadRespOrNil is ReadResp outside a test: nil when nothing decodes.
func ReadRespOrNil(c net.Conn) slotv1.Message {
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return nil
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(c, body); err != nil {
		return nil
	}
	f, err := slotv1.DecodeBody(body)
	if err != nil {
		return nil
	}
	return f.Msg
}

// IsAcquireOK reports whether m is an ACQUIRE_OK.
func IsAcquireOK(m slotv1.Message) bool { _, ok := m.(*slotv1.AcquireOK); return ok }

// MetricValue is the value of one series in a scrape.
func MetricValue(body, series string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}
