// Package metrics defines cpuslot's Prometheus metrics. Per-invocation data
// is aggregated: no label carries an invocation or thread id, and action
// names are capped so a flood of distinct names cannot blow up cardinality.
package metrics

import (
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxActions bounds the distinct action label values; later ones are
// counted as "_other".
const MaxActions = 500

// MaxLabelLen bounds a label value taken from outside the agent.
const MaxLabelLen = 256

// Label is the one place a label value from outside the agent (an action
// name from a pod, a container's cgroup name) becomes safe to export: the
// Prometheus client panics on invalid UTF-8, and control characters or
// unbounded lengths break dashboards. Invalid bytes become U+FFFD, control
// characters '?', and the value is cut at MaxLabelLen bytes.
func Label(v string) string {
	clean := utf8.ValidString(v) && len(v) <= MaxLabelLen
	for _, r := range v {
		if !clean {
			break
		}
		clean = !unicode.IsControl(r)
	}
	if clean {
		return v
	}
	v = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(v, "\uFFFD"))
	if len(v) > MaxLabelLen {
		n := MaxLabelLen
		for n > 0 && !utf8.RuneStart(v[n]) {
			n--
		}
		v = v[:n]
	}
	return v
}

// ConstGauge is prometheus.MustNewConstMetric for a gauge whose label
// values come from outside the agent: they go through Label.
func ConstGauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	for i, l := range labels {
		labels[i] = Label(l)
	}
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

// AdmissionResults are the results of cpuslot_admission_total: what
// happened to an acquisition that did not fit the CPU budget at once.
// Every result the agent counts is listed here and exported from the start.
var AdmissionResults = []string{
	"queued",                // waited for budget
	"degraded",              // granted a smaller quota
	"rejected",              // refused (also a RECLAIM that does not fit)
	"timeout",               // waited past its wait budget
	"reclaimed_over_budget", // a slot adopted after a restart, reclaimed beyond the budget
}

// ErrorReasons are the reasons of cpuslot_errors_total. Every reason the
// agent counts is listed here and exported from the start, so rates and
// alerts see a zero rather than nothing; failed cgroup operations add
// "cgroup_<operation>".
var ErrorReasons = []string{
	// wire: what a peer sent or did
	"bad_request",      // a request the agent refuses (invalid field, foreign thread)
	"bad_frame",        // a frame that does not decode or exceeds its bounds
	"no_hello",         // a first request that is not HELLO
	"not_served",       // a peer in no container the agent serves
	"unknown_lease",    // a lease that is not the peer's
	"connection_limit", // a connection over the per-node or per-process cap
	"accept_failed",    // accept failed (e.g. out of fds); the agent backs off
	"socket_failed",    // a pod's socket could not be made (e.g. a planted file)
	// pool: slots and threads
	"slots_exhausted",      // all slots of a container busy
	"containers_exhausted", // a container over the cap on served containers
	"container_not_found",  // a container's cgroup was not found
	"container_gone",       // a served container's cgroup went away: its pool is stale
	"pool_config",          // a container's pool settings are invalid
	"stale_tid",            // a recorded TID now names another thread: not moved
	"agent_thread_in_slot", // an agent thread found in a slot, moved back
	"mkdir_refused", "create_failed", "open_failed", "place_failed",
	"retune_failed", "remove_failed", "teardown_failed", "prewarm_failed",
	"read_usage",
}

// Metrics holds the agent's collectors. A nil *Metrics records nothing, so
// unit tests may pass nil.
type Metrics struct {
	acquireDuration   *prometheus.HistogramVec
	placementDuration prometheus.Histogram
	cgroupOpDuration  *prometheus.HistogramVec
	acquisitions      *prometheus.CounterVec
	admission         *prometheus.CounterVec
	invocations       *prometheus.CounterVec
	cpuSeconds        *prometheus.CounterVec
	throttledSeconds  *prometheus.CounterVec
	errors            *prometheus.CounterVec
	connections       prometheus.Gauge
	info              *prometheus.GaugeVec

	mu         sync.Mutex
	actions    map[string]bool
	maxActions int
}

// latencyBuckets span 2us..~1s: a placement is microseconds when cheap and
// milliseconds when it waits on the kernel's cgroup lock.
var latencyBuckets = prometheus.ExponentialBuckets(2e-6, 2, 20)

// New registers cpuslot's metrics on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		acquireDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cpuslot_acquire_duration_seconds", Help: "Agent-side time to grant a slot, from request to response.",
			Buckets: latencyBuckets}, []string{"mode"}),
		placementDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "cpuslot_placement_duration_seconds", Help: "Time of thread placements done by the agent (numeric TID writes).",
			Buckets: latencyBuckets}),
		cgroupOpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cpuslot_cgroup_operation_duration_seconds", Help: "Time of cgroup file operations by operation.",
			Buckets: latencyBuckets}, []string{"operation"}),
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_acquisitions_total", Help: "Granted acquisitions by how the slot was found (affinity_hit needs no cgroup write)."},
			[]string{"outcome"}),
		admission: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_admission_total", Help: "Acquisitions that did not fit the CPU budget at once, by what happened: " + strings.Join(AdmissionResults, ", ") + "."},
			[]string{"result"}),
		invocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_lease_releases_total", Help: "Released leases by action and outcome (ok, failed, timeout, placement_failed, abandoned, superseded)."},
			[]string{"action", "outcome"}),
		cpuSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_invocation_cpu_seconds_total", Help: "CPU time used in slots while leased, by action."},
			[]string{"action"}),
		throttledSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_invocation_throttled_seconds_total", Help: "Time slots were throttled while leased, by action."},
			[]string{"action"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_errors_total", Help: "Errors by reason: " + strings.Join(ErrorReasons, ", ") + ", cgroup_<operation>."},
			[]string{"reason"}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cpuslot_connections", Help: "Open client connections."}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cpuslot_agent_info", Help: "Always 1; labels describe the node's cgroup setup."},
			[]string{"hierarchy", "favordynmods", "version"}),
		actions:    map[string]bool{},
		maxActions: MaxActions,
	}
	reg.MustRegister(m.acquireDuration, m.placementDuration, m.cgroupOpDuration, m.acquisitions, m.admission,
		m.invocations, m.cpuSeconds, m.throttledSeconds, m.errors, m.connections, m.info)
	for _, r := range AdmissionResults {
		m.admission.WithLabelValues(r)
	}
	for _, o := range []string{"affinity_hit", "cache_hit", "retuned", "created", "reclaimed"} {
		m.acquisitions.WithLabelValues(o)
	}
	for _, r := range ErrorReasons {
		m.errors.WithLabelValues(r)
	}
	return m
}

// Info publishes the node's cgroup setup.
func (m *Metrics) Info(hierarchy string, favorDynMods bool, version string) {
	if m == nil {
		return
	}
	fdm := "false"
	if favorDynMods {
		fdm = "true"
	}
	m.info.WithLabelValues(hierarchy, fdm, version).Set(1)
}

// SetMaxActions sets the node-wide bound on action labels. Pools cap the
// names of each container (pool.Config.MaxActions); this bound is their
// sum, a backstop.
func (m *Metrics) SetMaxActions(n int) {
	if m != nil {
		m.mu.Lock()
		m.maxActions = n
		m.mu.Unlock()
	}
}

// Acquired counts a grant.
func (m *Metrics) Acquired(mode, outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.acquireDuration.WithLabelValues(mode).Observe(d.Seconds())
	m.acquisitions.WithLabelValues(outcome).Inc()
}

// Admission counts an acquisition that did not fit at once.
func (m *Metrics) Admission(result string) {
	if m != nil {
		m.admission.WithLabelValues(result).Inc()
	}
}

// Released accounts a finished lease.
func (m *Metrics) Released(action, outcome string, cpu, throttled time.Duration) {
	if m == nil {
		return
	}
	a := m.action(action)
	m.invocations.WithLabelValues(a, outcome).Inc()
	m.cpuSeconds.WithLabelValues(a).Add(cpu.Seconds())
	m.throttledSeconds.WithLabelValues(a).Add(throttled.Seconds())
}

func (m *Metrics) action(a string) string {
	if a == "" {
		return "_unnamed"
	}
	a = Label(a)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.actions[a] {
		return a
	}
	if len(m.actions) >= m.maxActions {
		return "_other"
	}
	m.actions[a] = true
	return a
}

// CgroupOp observes one cgroup operation; failures are also counted as
// errors with reason "cgroup_<op>".
func (m *Metrics) CgroupOp(op string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.cgroupOpDuration.WithLabelValues(op).Observe(d.Seconds())
	if op == "place" {
		m.placementDuration.Observe(d.Seconds())
	}
	if err != nil {
		m.errors.WithLabelValues("cgroup_" + op).Inc()
	}
}

// Error counts an error by reason.
func (m *Metrics) Error(reason string) {
	if m != nil {
		m.errors.WithLabelValues(reason).Inc()
	}
}

// Connections tracks open client connections.
func (m *Metrics) Connections(delta int) {
	if m != nil {
		m.connections.Add(float64(delta))
	}
}
