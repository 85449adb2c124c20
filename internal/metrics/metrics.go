// Package metrics defines cpuslot's Prometheus metrics. Per-invocation data
// is aggregated: no label carries an invocation or thread id, and action
// names are capped so a flood of distinct names cannot blow up cardinality.
// Per-action series carry their container, so no tenant moves another's,
// and end with the container's pool.
package metrics

import (
	"runtime"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/cpuslot/cpuslot/internal/outcome"
	"github.com/cpuslot/cpuslot/internal/safetext"
	"github.com/prometheus/client_golang/prometheus"
)

// MaxActions bounds the distinct (container, action) label pairs; later
// ones are counted as "_other".
const MaxActions = 500

// MaxLabelLen bounds a label value taken from outside the agent.
const MaxLabelLen = 256

// Label is the one place a label value from outside the agent (an action
// name from a pod, a container's cgroup name) becomes safe to export: the
// Prometheus client panics on invalid UTF-8, and hidden characters (control,
// bidi and other format characters, line separators) or unbounded lengths
// break or spoof dashboards. safetext.Text replaces those; the value is cut
// at MaxLabelLen bytes.
func Label(v string) string {
	v = safetext.Text(v)
	if len(v) > MaxLabelLen {
		n := MaxLabelLen
		for n > 0 && !utf8.RuneStart(v[n]) {
			n--
		}
		v = v[:n]
	}
	return v
}

// LegacyContainerLabel holds a container's whole name, as the container
// label did before it was split (deprecated: removed in the next release).
const LegacyContainerLabel = "cpuslot_container"

// containerLabels are the first labels of every per-container series.
var containerLabels = []string{"namespace", "pod", "container", LegacyContainerLabel}

// withContainer is containerLabels followed by more.
func withContainer(more ...string) []string {
	return append(append([]string(nil), containerLabels...), more...)
}

// containerValues are the values of containerLabels for a container's
// name: in Kubernetes namespace/pod/container, each apart (as cAdvisor and
// kube-state-metrics label them, so the series join); standalone a cgroup
// path (always absolute), which is the container label, with no namespace
// or pod. Each part is a Label of its own (a pod's names are hostile).
func containerValues(name string) []string {
	ns, pod, c := "", "", name
	if !strings.HasPrefix(name, "/") {
		if p := strings.Split(name, "/"); len(p) == 3 {
			ns, pod, c = p[0], p[1], p[2]
		}
	}
	return []string{Label(ns), Label(pod), Label(c), Label(name)}
}

// ConstGauge is prometheus.MustNewConstMetric for a gauge whose label
// values come from outside the agent: they go through Label.
func ConstGauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	for i, l := range labels {
		labels[i] = Label(l)
	}
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

// Metrics holds the agent's collectors. A nil *Metrics records nothing, so
// unit tests may pass nil.
type Metrics struct {
	acquireDuration   *prometheus.HistogramVec
	placementDuration prometheus.Histogram
	wakeToQuota       prometheus.Histogram
	cgroupOpDuration  *prometheus.HistogramVec
	acquisitions      *prometheus.CounterVec
	admission         *prometheus.CounterVec
	invocations       *prometheus.CounterVec
	cpuSeconds        *prometheus.CounterVec
	throttledSeconds  *prometheus.CounterVec
	errors            *prometheus.CounterVec
	connections       prometheus.Gauge
	info              *prometheus.GaugeVec
	buildInfo         *prometheus.GaugeVec

	mu sync.Mutex
	// actions are the action labels in use, by container; nActions counts
	// them all.
	actions    map[string]map[string]bool
	nActions   int
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
		wakeToQuota: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "cpuslot_wake_to_quota_seconds", Help: "Time from a sleeping lease's WAKE to its whole quota back: charged in full and the borrowers it displaces lowered to the budget (docs/lending.md).",
			Buckets: latencyBuckets}),
		cgroupOpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cpuslot_cgroup_operation_duration_seconds", Help: "Time of cgroup file operations by operation.",
			Buckets: latencyBuckets}, []string{"operation"}),
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_acquisitions_total", Help: "Granted acquisitions by how the slot was found (affinity_hit needs no cgroup write)."},
			[]string{"outcome"}),
		admission: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_admission_total", Help: "Acquisitions that did not fit the CPU budget at once, by what happened: " + join(AdmissionResults) + "."},
			[]string{"result"}),
		invocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_lease_releases_total", Help: "Released leases by container, action and outcome (" + join(outcome.Endings) + "); action " + outcome.HoldAction + ": HOLD leases (local leasing), whose invocations the runtime reports under their own actions."},
			withContainer("action", "outcome")),
		cpuSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_invocation_cpu_seconds_total", Help: "CPU time used in slots while leased, by container and action; " + outcome.HoldAction + ": the slots of HOLD leases over the whole hold, measured by the agent (the other actions of local leasing are the runtime's reports)."},
			withContainer("action")),
		throttledSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_invocation_throttled_seconds_total", Help: "Time slots were throttled while leased, by container and action."},
			withContainer("action")),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cpuslot_errors_total", Help: "Errors by reason: " + join(ErrorReasons) + "."},
			[]string{"reason"}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cpuslot_connections", Help: "Open client connections."}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cpuslot_agent_info", Help: "Always 1; labels describe the node's cgroup setup."},
			[]string{"hierarchy", "favordynmods", "version"}),
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cpuslot_build_info", Help: "Always 1; labels name the agent's build."},
			[]string{"version", "goversion"}),
		actions:    map[string]map[string]bool{},
		maxActions: MaxActions,
	}
	reg.MustRegister(m.acquireDuration, m.placementDuration, m.wakeToQuota, m.cgroupOpDuration, m.acquisitions, m.admission,
		m.invocations, m.cpuSeconds, m.throttledSeconds, m.errors, m.connections, m.info, m.buildInfo)
	for _, r := range AdmissionResults {
		m.admission.WithLabelValues(string(r))
	}
	for _, o := range outcome.Acquisitions {
		m.acquisitions.WithLabelValues(string(o))
	}
	for _, r := range ErrorReasons {
		m.errors.WithLabelValues(string(r))
	}
	return m
}

// join lists label values for a help text.
func join[T ~string](vs []T) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
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
	m.buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
}

// SetMaxActions sets the node-wide bound on (container, action) labels.
// Pools cap the names of each container (settings.Pool.MaxActions); this
// bound is their sum, a backstop.
func (m *Metrics) SetMaxActions(n int) {
	if m != nil {
		m.mu.Lock()
		m.maxActions = n
		m.mu.Unlock()
	}
}

// Acquired counts a grant.
func (m *Metrics) Acquired(mode string, how outcome.Acquisition, d time.Duration) {
	if m == nil {
		return
	}
	m.acquireDuration.WithLabelValues(mode).Observe(d.Seconds())
	m.acquisitions.WithLabelValues(string(how)).Inc()
}

// WakeToQuota observes a wake of a sleeping lease, from its WAKE to its
// quota back (its borrowers cut).
func (m *Metrics) WakeToQuota(d time.Duration) {
	if m != nil {
		m.wakeToQuota.Observe(d.Seconds())
	}
}

// Admission counts an acquisition that did not fit at once.
func (m *Metrics) Admission(result AdmissionResult) {
	if m != nil {
		m.admission.WithLabelValues(string(result)).Inc()
	}
}

// Released accounts a finished lease of container.
func (m *Metrics) Released(container, action string, how outcome.Ending, cpu, throttled time.Duration) {
	if m == nil {
		return
	}
	c, a := m.action(container, action)
	m.invocations.WithLabelValues(append(c, a, string(how))...).Inc()
	m.cpuSeconds.WithLabelValues(append(c, a)...).Add(cpu.Seconds())
	m.throttledSeconds.WithLabelValues(append(c, a)...).Add(throttled.Seconds())
}

// Reported accounts invocations a client reports (USAGE): n released
// leases of action ending how, and the CPU and throttled time it says they
// used. Every value is a valid report: nanoseconds become seconds as a
// float, never a time.Duration, which would wrap to a negative increment
// (a panic in the metrics library).
func (m *Metrics) Reported(container, action string, how outcome.Ending, n, cpuNanos, throttledNanos uint64) {
	if m == nil {
		return
	}
	c, a := m.action(container, action)
	m.invocations.WithLabelValues(append(c, a, string(how))...).Add(float64(n))
	m.cpuSeconds.WithLabelValues(append(c, a)...).Add(float64(cpuNanos) / 1e9)
	m.throttledSeconds.WithLabelValues(append(c, a)...).Add(float64(throttledNanos) / 1e9)
}

// action returns the container's label values (a slice with room for two
// more) and the action label of a count, the action "_other" once the
// node-wide bound is reached.
func (m *Metrics) action(container, a string) ([]string, string) {
	c := append(make([]string, 0, len(containerLabels)+2), containerValues(container)...)
	key := c[len(c)-1] // the whole name
	if a == "" {
		return c, unnamed
	}
	if a == outcome.HoldAction {
		return c, outcome.HoldAction
	}
	a = Label(a)
	m.mu.Lock()
	defer m.mu.Unlock()
	names := m.actions[key]
	if names[a] {
		return c, a
	}
	if m.nActions >= m.maxActions {
		return c, "_other"
	}
	if names == nil {
		names = map[string]bool{}
		m.actions[key] = names
	}
	names[a] = true
	m.nActions++
	return c, a
}

// ForgetContainer deletes a container's per-action series, when its pool
// ends, so that containers come and go without the series piling up.
func (m *Metrics) ForgetContainer(container string) {
	if m == nil {
		return
	}
	v := containerValues(container)
	key := v[len(v)-1]
	m.mu.Lock()
	m.nActions -= len(m.actions[key])
	delete(m.actions, key)
	m.mu.Unlock()
	l := prometheus.Labels{}
	for i, name := range containerLabels {
		l[name] = v[i]
	}
	m.invocations.DeletePartialMatch(l)
	m.cpuSeconds.DeletePartialMatch(l)
	m.throttledSeconds.DeletePartialMatch(l)
}

// unnamed is the action label of a lease whose client named no action.
const unnamed = "_unnamed"

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
		m.errors.WithLabelValues(string(cgroupReason(op))).Inc()
	}
}

// Error counts an error by reason.
func (m *Metrics) Error(reason Reason) {
	if m != nil {
		m.errors.WithLabelValues(string(reason)).Inc()
	}
}

// ErrorN counts n errors of one reason at once.
func (m *Metrics) ErrorN(reason Reason, n int) {
	if m != nil && n > 0 {
		m.errors.WithLabelValues(string(reason)).Add(float64(n))
	}
}

// Connections tracks open client connections.
func (m *Metrics) Connections(delta int) {
	if m != nil {
		m.connections.Add(float64(delta))
	}
}
