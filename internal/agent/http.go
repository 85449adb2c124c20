package agent

// The agent's HTTP endpoints: /metrics (with the pools' gauges),
// /healthz (stalled loops), /readyz and /debug/pools.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/pool"
)

// minStall is the least time a loop's work in hand may take before
// /healthz calls it a stall (a variable for tests); the bound is 5
// maintenance rounds otherwise.
var minStall = time.Minute

// healthy reports a stalled loop: a maintenance round that does not end (a
// cgroup write that hangs, a lock never given back), an accept loop held
// up with a connection in hand, a source's worker that does not finish
// serving a pod. Each must end its work in hand within
// max(5 x reapInterval, minStall); waiting for work is no stall.
func (a *Agent) healthy(now time.Time) error {
	limit := max(5*a.cfg.ReapInterval.Duration, minStall)
	errs := []error{a.maintenance.Stalled(now, limit)}
	for _, c := range a.checkers {
		errs = append(errs, c.Stalled(now, limit))
	}
	return errors.Join(errs...)
}

// poolGauges is the pools' state for a scrape.
func (a *Agent) poolGauges() []metrics.Pool {
	var out []metrics.Pool
	for _, s := range a.Summaries() {
		g := metrics.Pool{Container: s.Name, BudgetMilli: s.BudgetMilli, UsedMilli: s.UsedMilli, Leases: s.Leases,
			LentMilli: s.LentMilli, Wakes: s.Wakes, Lends: s.Lends, GiveBacks: s.GiveBacks, Cuts: s.Cuts}
		for _, q := range s.Quotas {
			g.Quotas = append(g.Quotas, metrics.Quota{Quota: pool.FormatQuota(q.QuotaMilli), Free: q.Free, Leased: q.Leased, Slots: q.Slots})
		}
		out = append(out, g)
	}
	return out
}

// fromLoopback reports whether r came from a loopback address: in a pod
// the agent's own network namespace, on the host the node. The address is
// the TCP peer's; nothing the client sends is believed.
func fromLoopback(r *http.Request) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// Handler serves /metrics, /healthz, /readyz and /debug/pools; the last
// only to loopback peers unless DebugPoolsRemote says otherwise: it names
// every container and its budget, and the port may be open on the pod
// network for /metrics.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{Registry: a.registry}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := a.healthy(time.Now()); err != nil {
			a.log.Error("unhealthy", "err", err)
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/debug/pools", func(w http.ResponseWriter, r *http.Request) {
		if !a.cfg.DebugPoolsRemote && !fromLoopback(r) {
			http.Error(w, "/debug/pools is served to loopback only (debugPoolsRemote)", http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(map[string]any{"hierarchy": a.hierarchy, "pools": a.Summaries()})
	})
	return mux
}
