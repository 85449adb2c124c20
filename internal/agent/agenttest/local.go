package agenttest

import (
	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"net"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/agent"
	"golang.org/x/sys/unix"
)

// Local leasing (HOLD leases, USAGE) spoken raw.

// LocalEnv is an agent whose peers are live child processes of the host's
// PID namespace; on v1 they get fds only with hostNamespaceFDs (a pod,
// in a PID namespace of its own, gets them without).
func LocalEnv(t *testing.T, mutate func(*agent.Config)) *Env {
	return NewEnv(t, 0, func(c *agent.Config) {
		c.Limits.HostNamespaceFDs = true
		if mutate != nil {
			mutate(c)
		}
	})
}

// ReadFDs reads one response and the fds that came with it (closed here).
func ReadFDs(t *testing.T, c net.Conn) (slotv1.Message, int) {
	t.Helper()
	body, fds, err := ReadRawFrame(c.(*net.UnixConn))
	for _, fd := range fds {
		unix.Close(fd)
	}
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	f, err := slotv1.DecodeBody(body)
	if err != nil {
		t.Fatal(err)
	}
	return f.Msg, len(fds)
}

// HelloWith says HELLO with flags on c.
func HelloWith(t *testing.T, c net.Conn, flags uint32) *slotv1.HelloOK {
	t.Helper()
	c.Write(Frame(t, &slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: flags}))
	m, _ := ReadFDs(t, c)
	ok, isOK := m.(*slotv1.HelloOK)
	if !isOK {
		t.Fatalf("hello refused: %+v", m)
	}
	return ok
}

// LocalConn is a connection of the live child l that was granted LOCAL.
func LocalConn(t *testing.T, socket string, l *LiveChild) net.Conn {
	t.Helper()
	c := l.Dial(t, socket)
	c.SetDeadline(time.Now().Add(time.Minute))
	if ok := HelloWith(t, c, slotv1.HelloFDPassing|slotv1.HelloLocal); ok.Flags&slotv1.HelloOKLocal == 0 || ok.Flags&slotv1.HelloOKAgentPlaces != 0 {
		t.Fatalf("LOCAL not granted: flags %b", ok.Flags)
	}
	return c
}

// HoldReq is an ACQUIRE with HOLD.
func HoldReq(q, waitUS uint32) *slotv1.Acquire {
	return &slotv1.Acquire{QuotaMilli: q, WaitUS: waitUS, Flags: slotv1.AcquireHold}
}

// IsReleaseOK reports whether m is a RELEASE_OK.
func IsReleaseOK(m slotv1.Message) bool { _, ok := m.(*slotv1.ReleaseOK); return ok }
