package server

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"github.com/cpuslot/cpuslot/internal/pool"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// openAndPass is the child side: it connects to sock, says the HELLO frame
// (hex), reads the answer, passes the connection over fd 3 and exits.
func openAndPass(sock, hello string) int {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return 1
	}
	b, _ := hex.DecodeString(hello)
	c.Write(b)
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return 2
	}
	if _, err := io.ReadFull(c, make([]byte, binary.BigEndian.Uint32(hdr[:]))); err != nil {
		return 3
	}
	f, _ := c.File()
	pair, err := net.FileConn(os.NewFile(3, "pair"))
	if err != nil {
		return 4
	}
	if _, _, err := pair.(*net.UnixConn).WriteMsgUnix([]byte{1}, unix.UnixRights(int(f.Fd())), nil); err != nil {
		return 5
	}
	return 0
}

// oneResolver serves every peer from one pool.
type oneResolver struct{ p *pool.Pool }

func (r oneResolver) Resolve(Peer) (*pool.Pool, error)    { return r.p, nil }
func (r oneResolver) Holds(Peer, *pool.Pool) bool         { return true }
func (r oneResolver) Processes(*pool.Pool) ([]int, error) { return nil, nil }
func (r oneResolver) Serving(string) string               { return "" }

// deadOpenersConn has a child process connect, say HELLO with flags and
// exit; it returns the connection, which the test keeps.
func deadOpenersConn(t *testing.T, sock string, flags uint32) *net.UnixConn {
	t.Helper()
	hello, err := slotv1.Append(nil, 1, &slotv1.Hello{MinVersion: 1, MaxVersion: 1, Flags: flags})
	if err != nil {
		t.Fatal(err)
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := os.NewFile(uintptr(sp[0]), "pair"), os.NewFile(uintptr(sp[1]), "pair")
	defer mine.Close()
	exe, _ := os.Executable()
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "CPUSLOT_TEST_OPENER="+sock, "CPUSLOT_TEST_HELLO="+hex.EncodeToString(hello))
	cmd.ExtraFiles = []*os.File{theirs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	pc, err := net.FileConn(mine)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	pc.SetDeadline(time.Now().Add(time.Minute))
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := pc.(*net.UnixConn).ReadMsgUnix(make([]byte, 1), oob)
	if werr := cmd.Wait(); err != nil || werr != nil {
		t.Fatalf("opener: %v, exit %v", err, werr)
	}
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	fds, _ := unix.ParseUnixRights(&msgs[0])
	f := os.NewFile(uintptr(fds[0]), "conn")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(time.Minute))
	return c.(*net.UnixConn)
}

// TestDeadOpenerRefusedPerRequest: with the watch of
// client processes' exits off, every request on a connection whose opener
// has exited is still answered NOT_SERVED and the connection closed:
// HOLD, ACQUIRE, HOLD_LIST, RECLAIM, USAGE and RELEASE, each on a connection
// granted LOCAL at HELLO while its opener lived.
func TestDeadOpenerRefusedPerRequest(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 0)
	ctr, err := h.Container(rel, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := settings.Default()
	cfg.Prewarm = map[uint32]int{250: 1}
	p, err := pool.New(rel, cfg, pool.CgroupBackend(ctr), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	s := New(oneResolver{p}, h, nil, slog.New(slog.DiscardHandler))
	l := DefaultLimits
	l.HostNamespaceFDs = true // LOCAL needs fds; on v1 a host peer gets them only so
	s.SetLimits(l)
	s.watchExits = false
	ln, err := Listen(filepath.Join(t.TempDir(), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { ln.Close(); s.Shutdown(); p.Close(true) })

	frame := func(m slotv1.Message) []byte {
		b, err := slotv1.Append(nil, 7, m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	usage := frame(&slotv1.Usage{Records: []slotv1.UsageRecord{{Action: "ghost", Outcome: slotv1.InvocationOK, Invocations: 1}}})
	for what, req := range map[string][]byte{
		"HOLD":              frame(&slotv1.Acquire{QuotaMilli: 250, Flags: slotv1.AcquireHold}),
		"ACQUIRE":           frame(&slotv1.Acquire{QuotaMilli: 250, TID: 1}),
		"HOLD_LIST":         frame(&slotv1.HoldListRequest{}),
		"RECLAIM of a HOLD": frame(&slotv1.Reclaim{Slot: 1, QuotaMilli: 250}),
		"USAGE":             usage,
		"RELEASE":           frame(&slotv1.Release{Lease: 1}),
	} {
		c := deadOpenersConn(t, ln.path, slotv1.HelloFDPassing|slotv1.HelloLocal)
		c.Write(req)
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			t.Fatalf("%s on a dead opener's connection: no answer (%v)", what, err)
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(c, body); err != nil {
			t.Fatal(err)
		}
		f, err := slotv1.DecodeBody(body)
		if err != nil {
			t.Fatal(err)
		}
		if pe, ok := f.Msg.(*slotv1.Error); !ok || pe.Code != slotv1.CodeNotServed {
			t.Errorf("%s on a dead opener's connection: %+v, want NOT_SERVED", what, f.Msg)
			continue
		}
		if _, err := io.ReadAll(c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s: connection not closed after NOT_SERVED: %v", what, err)
		}
	}
	if sum := p.Summary(); sum.Leases != 0 || sum.UsedMilli != 0 {
		t.Errorf("after requests on dead openers' connections: %+v", sum)
	}
}
