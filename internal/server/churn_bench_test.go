package server

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"github.com/cpuslot/cpuslot/internal/metrics"
)

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
