package server

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"github.com/cpuslot/cpuslot/internal/metrics"
)

// TestChurnedConnectionsNotServed: a connection whose peer has closed it
// before the agent took it, having sent nothing (a reconnect loop's), is
// closed at accept: it gets no goroutine and its peer is not identified.
// One whose peer sent its HELLO before closing its side is still served.
// Watched failing before the agent looked: "50 of 50 connections closed
// before their accept were identified".
func TestChurnedConnectionsNotServed(t *testing.T) {
	h := cgrouptest.Kernel(t)
	var identified atomic.Int64
	SetIdentifyHooks(false, func() { identified.Add(1) })
	t.Cleanup(func() { SetIdentifyHooks(false, nil) }) // after the agent's Shutdown
	l := DefaultLimits
	l.AcceptRate, l.SharedAcceptRate = 1<<30, 1<<30
	// The accept loop is held up in the first connection's charge (which
	// container its cgroup is in) while the rest queue behind it.
	r := &holdingResolver{countingResolver: countingResolver{read: map[string]int{}}, in: make(chan struct{}), hold: make(chan struct{})}
	g := newChurnRig(t, h, l, r)
	sock := g.listen("shared.sock", g.s.Serve)
	first, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	select {
	case <-r.in:
	case <-time.After(time.Minute):
		t.Fatal("the first connection was not taken within a minute")
	}
	const closed = 50
	addr := &unix.SockaddrUnix{Name: sock}
	for i := 0; i < closed; i++ {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Connect(fd, addr); err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
	}
	// The last one says HELLO and closes its side before it is taken.
	last, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer last.Close()
	hello, err := slotv1.Append(nil, 1, &slotv1.Hello{MinVersion: 1, MaxVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	last.Write(hello)
	last.CloseWrite()
	close(r.hold)
	last.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadFull(last, make([]byte, 4)); err != nil {
		t.Fatalf("the HELLO sent before its connection was taken was not answered: %v", err)
	}
	if n := identified.Load() - 2; n > 0 {
		t.Errorf("%d of %d connections closed before their accept were identified", n, closed)
	}
}

// holdingResolver holds up the accept loop in its first Serving until
// hold is closed, having said so on in.
type holdingResolver struct {
	countingResolver
	once     sync.Once
	in, hold chan struct{}
}

func (r *holdingResolver) Serving(cg string) string {
	r.once.Do(func() { close(r.in); <-r.hold })
	return r.countingResolver.Serving(cg)
}

// BenchmarkChurn measures what a churned connection (connect, close, as a
// reconnect loop makes them) costs the accept loop of the shared socket,
// the churner's connect and close included: "paced", past its cgroup's
// burst (closed at accept), and "taken on" (rates no bucket reaches). Run
// with -cpuprofile to see where the agent's part goes (root).
func BenchmarkChurn(b *testing.B) {
	h := cgrouptest.Kernel(b)
	for _, bc := range []struct {
		name  string
		burst int
	}{{"paced", 1}, {"taken-on", 1 << 30}} {
		b.Run(bc.name, func(b *testing.B) {
			l := DefaultLimits
			l.AcceptRate, l.AcceptBurst, l.SharedAcceptRate = 1, bc.burst, 1<<30
			if bc.burst > 1 {
				l.AcceptRate = 1 << 30
			}
			s := New(&countingResolver{read: map[string]int{}}, h, metrics.New(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
			s.SetLimits(l)
			defer s.Shutdown()
			sock := filepath.Join(b.TempDir(), "shared.sock")
			ln, err := Listen(sock)
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- s.Serve(ln) }()
			defer func() { ln.Close(); <-done }()
			addr := &unix.SockaddrUnix{Name: sock}
			b.ResetTimer()
			cpu0 := processCPU()
			for i := 0; i < b.N; {
				fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					b.Fatal(err)
				}
				err = unix.Connect(fd, addr)
				unix.Close(fd)
				if err == nil {
					i++
				} else {
					time.Sleep(10 * time.Microsecond) // the queue is full: the agent is behind
				}
			}
			// The queue is first in, first out: once the agent answers or
			// closes this one, it took every connection before it.
			c, err := net.Dial("unix", sock)
			for deadline := time.Now().Add(time.Minute); err != nil; c, err = net.Dial("unix", sock) {
				if time.Now().After(deadline) {
					b.Fatalf("no connect within a minute: %v", err)
				}
				time.Sleep(time.Millisecond)
			}
			hello, _ := slotv1.Append(nil, 1, &slotv1.Hello{MinVersion: 1, MaxVersion: 1})
			c.SetDeadline(time.Now().Add(time.Minute))
			c.Write(hello)
			if _, err := c.Read(make([]byte, 64)); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, unix.ECONNRESET) {
				b.Fatalf("the last connection was neither answered nor closed: %v", err)
			}
			c.Close()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/conn")
		})
	}
}

// processCPU is the CPU time this process has used, in ns.
func processCPU() int64 {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
