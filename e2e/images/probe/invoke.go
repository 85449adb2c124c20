package main

import (
	"fmt"
	"log"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	slotv1 "github.com/cpuslot/cpuslot/api/slot/v1"
	"github.com/cpuslot/cpuslot/client"
)

// invoker runs invocations one at a time on one locked OS thread, as a
// runtime's worker does: in a slot of quota when a client is set (the
// agent serves the pod), else without one.
type invoker struct {
	quota  uint32
	burn   time.Duration
	client atomic.Pointer[client.Client]
	jobs   chan chan invocation
}

// invocation is what one invocation reports: its slot ("none" without
// one) and the error of a release that failed.
type invocation struct {
	slot string
	err  error
}

func newInvoker(quota uint32, burn time.Duration) *invoker {
	iv := &invoker{quota: quota, burn: burn, jobs: make(chan chan invocation)}
	go iv.run()
	return iv
}

func (iv *invoker) run() {
	runtime.LockOSThread()
	for k := 0; ; k++ {
		done := <-iv.jobs
		c := iv.client.Load()
		if c == nil {
			burnFor(iv.burn)
			done <- invocation{slot: "none"}
			continue
		}
		l, err := c.Acquire(iv.quota, "e2e-invoke", strconv.Itoa(k))
		if err != nil {
			// Fail open: the invocation runs without a slot.
			log.Printf("probe: acquire (running without a slot): %v", err)
			burnFor(iv.burn)
			done <- invocation{slot: "none"}
			continue
		}
		burnFor(iv.burn)
		_, err = l.Release(slotv1.InvocationOK)
		done <- invocation{slot: strconv.FormatUint(uint64(l.Slot), 10), err: err}
	}
}

// ServeHTTP runs one invocation per request: 204 with X-Cpuslot-Slot, or
// 500 when its release failed. The request carries nothing the invocation
// reads.
func (iv *invoker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	done := make(chan invocation, 1)
	select {
	case iv.jobs <- done:
	case <-r.Context().Done():
		return
	}
	res := <-done
	w.Header().Set("X-Cpuslot-Slot", res.slot)
	if res.err != nil {
		http.Error(w, fmt.Sprintf("release: %v", res.err), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// runInvoke serves /invoke (see invoker) and returns the listen address.
// It connects to the agent in the background for as long as it takes: a
// pod the agent does not serve never gets a socket, and runs every
// invocation without a slot.
func runInvoke(args []string, mux *http.ServeMux) string {
	fs := newFlags("invoke")
	quota := fs.String("quota", "250m", "slot quota")
	burn := fs.Duration("burn", 0, "CPU burnt per invocation")
	addr := fs.String("addr", ":8080", "listen address")
	fs.Parse(args)
	q, err := parseQuota(*quota)
	if err != nil || q == 0 {
		log.Fatalf("probe: -quota %q: want e.g. 250m (%v)", *quota, err)
	}
	if *burn < 0 || *burn > time.Second {
		log.Fatalf("probe: -burn %v: want 0 to 1s", *burn)
	}
	iv := newInvoker(q, *burn)
	mux.Handle("/invoke", iv)
	go func() {
		c, _ := dialAgent(0)
		iv.client.Store(c)
	}()
	return *addr
}
