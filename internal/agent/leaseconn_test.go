package agent_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/agent/agenttest"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
)

// TestClientLeasesKeepTheirConnection: a lease is touched only on the
// connection that holds it, and an ACQUIRE may wait there for budget. Many
// threads of one process acquire, sleep, wake and release against the real
// agent with a budget of two slots, through local leasing and through
// thread leases: every frame naming a lease goes on its own connection, and
// none waits behind an ACQUIRE that waits for the budget it frees. Nothing
// is refused, nothing hangs, and at the end the container holds nothing.
func TestClientLeasesKeepTheirConnection(t *testing.T) {
	for _, local := range []bool{true, false} {
		t.Run(fmt.Sprintf("local=%v", local), func(t *testing.T) {
			e := agenttest.NewEnv(t, 0, func(c *agent.Config) {
				c.Admission.Budget = "500m"
				c.Admission.Policy = "queue"
				c.Admission.LendRatio = 0.5
			})
			a := e.Start()
			cgrouptest.JoinProcess(t, e.H, e.Rel)
			c, err := client.Dial(e.Socket, client.Options{Wait: 30 * time.Second, NoLocal: !local, LocalIdle: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Hello().Flags&slotv1.HelloOKLocal != 0; got != local {
				t.Fatalf("LOCAL granted %v, want %v", got, local)
			}
			const threads, rounds = 6, 40
			errs := make(chan error, threads*rounds*4)
			var wg sync.WaitGroup
			for w := 0; w < threads; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					runtime.LockOSThread() // never unlocked: the thread ends in a slot
					for i := 0; i < rounds; i++ {
						l, err := c.Acquire(250, "guest/conn", "")
						if err != nil {
							errs <- fmt.Errorf("acquire: %w", err)
							continue
						}
						if (w+i)%2 == 0 {
							if err := l.Sleep(); err != nil {
								errs <- fmt.Errorf("sleep: %w", err)
							}
							if err := l.Wake(); err != nil {
								errs <- fmt.Errorf("wake: %w", err)
							}
						}
						if _, err := l.Release(slotv1.InvocationOK); err != nil {
							errs <- fmt.Errorf("release: %w", err)
						}
					}
				}()
			}
			finished := make(chan struct{})
			go func() { wg.Wait(); close(finished) }()
			select {
			case <-finished:
			case <-time.After(5 * time.Minute):
				buf := make([]byte, 1<<20)
				t.Fatalf("threads still running after 5 minutes (a lease's frame stuck behind a waiting ACQUIRE?); agent: %+v\n%s",
					a.Summaries(), buf[:runtime.Stack(buf, true)])
			}
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			c.Close()
			agenttest.WaitFor(t, "the container's leases to end with the client", func() bool {
				s := a.Summaries()[0]
				return s.Leases == 0 && s.UsedMilli == 0
			})
		})
	}
}
