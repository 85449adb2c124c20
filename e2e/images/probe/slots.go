package main

import (
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
	"golang.org/x/sys/unix"
)

// parseQuota reads "250m" or "1" (CPUs) as milli-CPUs.
func parseQuota(s string) (uint32, error) {
	if v, ok := strings.CutSuffix(s, "m"); ok {
		n, err := strconv.ParseUint(v, 10, 32)
		return uint32(n), err
	}
	f, err := strconv.ParseFloat(s, 64)
	return uint32(f * 1000), err
}

func socketPath() string {
	if p := os.Getenv("CPUSLOT_SOCKET"); p != "" {
		return p
	}
	return "/run/cpuslot/agent.sock"
}

// dial waits for the agent's socket (it appears once the agent serves the
// pod) and connects; a minute without it ends the probe.
func dial() *client.Client {
	c, err := dialAgent(600)
	if err != nil {
		log.Fatalf("probe: %v", err)
	}
	return c
}

// dialAgent tries to connect every 100 ms, tries times (0: until it does).
func dialAgent(tries int) (*client.Client, error) {
	path := socketPath()
	var last error
	for i := 0; tries == 0 || i < tries; i++ {
		c, err := client.Dial(path, client.Options{Name: "e2e-probe"})
		if err == nil {
			h := c.Hello()
			log.Printf("probe: connected to %s: %+v", path, h)
			return c, nil
		}
		if last == nil || err.Error() != last.Error() {
			log.Printf("probe: dial %s: %v (retrying)", path, err)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("no agent at %s: %w", path, last)
}

// burnFor spins until the thread has used cpu of CPU time (not wall time).
func burnFor(cpu time.Duration) {
	start := threadCPU()
	x := 1.0
	for threadCPU()-start < cpu {
		for i := 0; i < 10000; i++ {
			x = x*1.0000001 + 1e-9
		}
	}
	_ = x
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

// loadStats is what `probe slots` serves at /stats. An invocation whose
// acquisition fails runs without a slot, as a runtime that fails open does
// (Unslotted); Failed counts releases that fail after a granted acquisition
// (the invocation's accounting is lost).
type loadStats struct {
	OK        int64            `json:"ok"`
	Unslotted int64            `json:"unslotted"`
	Failed    int64            `json:"failed"`
	Outcomes  map[string]int64 `json:"outcomes"`
	Errors    []string         `json:"errors"`
}

// runSlots keeps threads invoking: acquire a slot of quota, burn burn of
// CPU, release, pause; n invocations per thread (0: forever). Failures are
// counted and served at /stats with the last errors.
func runSlots(args []string, mux *http.ServeMux) {
	fs := newFlags("slots")
	quota := fs.String("quota", "250m", "slot quota")
	threads := fs.Int("threads", 2, "invoking threads")
	burn := fs.Duration("burn", 2*time.Millisecond, "CPU burnt per invocation")
	pause := fs.Duration("pause", 10*time.Millisecond, "pause between invocations")
	n := fs.Int("n", 0, "invocations per thread (0: forever)")
	fs.Parse(args)
	q, err := parseQuota(*quota)
	if err != nil {
		log.Fatalf("probe: -quota: %v", err)
	}
	// Dial in the background: the pod serves HTTP (and is Ready) at once,
	// whether or not the agent has made the socket yet.
	var c *client.Client
	dialed := make(chan struct{})
	go func() {
		c = dial()
		close(dialed)
	}()
	var mu sync.Mutex
	st := loadStats{Outcomes: map[string]int64{}}
	var ok, unslotted, failed atomic.Int64
	note := func(err error) {
		mu.Lock()
		if len(st.Errors) < 20 {
			st.Errors = append(st.Errors, time.Now().UTC().Format(time.RFC3339Nano)+" "+err.Error())
		}
		mu.Unlock()
		log.Printf("probe: %v", err)
	}
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		st.OK, st.Unslotted, st.Failed = ok.Load(), unslotted.Load(), failed.Load()
		json.NewEncoder(w).Encode(st)
	})
	for i := 0; i < *threads; i++ {
		go func(i int) {
			<-dialed
			runtime.LockOSThread()
			for k := 0; *n == 0 || k < *n; k++ {
				l, err := c.Acquire(q, "e2e-probe", fmt.Sprintf("t%d-%d", i, k))
				if err != nil {
					// Fail open: the invocation runs without a slot.
					unslotted.Add(1)
					note(fmt.Errorf("acquire (running without a slot): %w", err))
					burnFor(*burn)
					time.Sleep(*pause)
					continue
				}
				burnFor(*burn)
				if _, err := l.Release(slotv1.InvocationOK); err != nil {
					failed.Add(1)
					note(fmt.Errorf("release: %w", err))
				} else {
					ok.Add(1)
					mu.Lock()
					st.Outcomes[fmt.Sprint(l.Outcome)]++
					mu.Unlock()
				}
				time.Sleep(*pause)
			}
			log.Printf("probe: thread %d done", i)
		}(i)
	}
}

// runQuota measures what a thread in one slot gets: acquire, spin for wall
// time, release, print the slot's usage as JSON and exit.
func runQuota(args []string) {
	fs := newFlags("quota")
	quota := fs.String("quota", "250m", "slot quota")
	wall := fs.Duration("for", 2*time.Second, "wall time spent spinning in the slot")
	fs.Parse(args)
	q, err := parseQuota(*quota)
	if err != nil {
		log.Fatalf("probe: -quota: %v", err)
	}
	c := dial()
	runtime.LockOSThread()
	l, err := c.Acquire(q, "e2e-quota", "quota")
	if err != nil {
		log.Fatalf("probe: acquire: %v", err)
	}
	t0 := time.Now()
	cpu0 := threadCPU()
	x := 1.0
	for time.Since(t0) < *wall {
		for i := 0; i < 10000; i++ {
			x = x*1.0000001 + 1e-9
		}
	}
	_ = x
	elapsed, cpu := time.Since(t0), threadCPU()-cpu0
	u, err := l.Release(slotv1.InvocationOK)
	if err != nil {
		log.Fatalf("probe: release: %v", err)
	}
	json.NewEncoder(os.Stdout).Encode(map[string]any{
		"quotaMilli":       l.QuotaMilli,
		"slot":             l.Slot,
		"wallNanos":        elapsed.Nanoseconds(),
		"threadCPUNanos":   cpu.Nanoseconds(),
		"slotCPUNanos":     u.CPU.Nanoseconds(),
		"throttledNanos":   u.Throttled.Nanoseconds(),
		"periods":          u.Periods,
		"throttledPeriods": u.ThrottledPeriods,
	})
}
