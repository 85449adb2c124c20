package client_test

import (
	"runtime"
	"testing"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

// BenchmarkLocalFastPath: one thread's acquire and release of the held
// slot it sits in already (no write, nothing sent): the path local leasing
// keeps cheap.
func BenchmarkLocalFastPath(b *testing.B) {
	f := newFakeAgent(b, true)
	c, err := client.Dial(f.path, client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	onThread(func() {
		runtime.LockOSThread()
		l, err := c.Acquire(250, "bench", "")
		if err != nil {
			b.Fatal(err)
		}
		l.Release(slotv1.InvocationOK)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			l, err := c.Acquire(250, "bench", "")
			if err != nil {
				b.Fatal(err)
			}
			l.Release(slotv1.InvocationOK)
		}
	})
}
