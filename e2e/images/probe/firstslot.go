package main

import (
	"log"
	"runtime"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

// started is when the probe's first instruction ran, near enough: package
// variables are set before main, a millisecond or less after exec.
var started = time.Now()

// runFirstSlot measures how long after the container's start its first slot
// is ready: from its start the probe tries every millisecond to connect to
// the agent and acquire a slot of quota, and logs the time of the first
// grant and how many connection attempts it took (1: the socket was there
// before the container's first instruction). Then it serves, as `serve`.
func runFirstSlot(args []string) {
	fs := newFlags("firstslot")
	quota := fs.String("quota", "250m", "slot quota")
	fs.Parse(args)
	q, err := parseQuota(*quota)
	if err != nil {
		log.Fatalf("probe: -quota: %v", err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	path := socketPath()
	deadline := started.Add(2 * time.Minute)
	for tries := 1; ; tries++ {
		c, err := client.Dial(path, client.Options{Name: "e2e-probe"})
		if err == nil {
			var l *client.Lease
			if l, err = c.Acquire(q, "e2e-firstslot", "1"); err == nil {
				d := time.Since(started)
				l.Release(slotv1.InvocationOK)
				c.Close()
				log.Printf("probe: first slot %d ready first-slot-us=%d tries=%d", l.Slot, d.Microseconds(), tries)
				return
			}
			c.Close()
		}
		if time.Now().After(deadline) {
			log.Printf("probe: no slot 2 min after start (%d tries): %v", tries, err)
			return
		}
		time.Sleep(time.Millisecond)
	}
}
