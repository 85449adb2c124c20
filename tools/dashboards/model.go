package main

// The one definition of the chart's dashboards: every panel's title, query,
// unit, legend, thresholds and stacking. grafana.go and perses.go turn it
// into each tool's format; nothing else holds a query.

// Dashboard is one dashboard. Variables in queries: $<Job.Name> (the job
// the chart's values set), each ListVar by name, and $__rate_interval.
type Dashboard struct {
	// File names the generated files: dashboards/<File>.json and
	// dashboards/perses/<File>.json.
	File, UID, Title, Description string
	// Link is the UID of the other dashboard, linked in the header.
	Link string
	Job  JobVar
	Vars []ListVar
	Rows []Row
}

// JobVar is a hidden constant holding the Prometheus job label; the chart
// replaces Default by its value (metrics.job, runtimeMetrics.job).
type JobVar struct{ Name, Default string }

// ListVar is a multi-value selector filled with the values of LabelName on
// the series of Selector; All matches everything (.*).
type ListVar struct{ Name, Label, Selector, LabelName string }

// Row is a titled group of panels, laid out left to right on a 24-column
// grid.
type Row struct {
	Title  string
	Panels []Panel
}

// Kind is how a panel draws its queries.
type Kind int

const (
	// Stat is one number: the last value of its single query.
	Stat Kind = iota
	// TimeSeries is a line chart, one line per series.
	TimeSeries
	// Table is one row per series of an instant query, labels as columns.
	Table
)

// Height of each kind in grid units.
func (k Kind) height() int {
	if k == TimeSeries {
		return 8
	}
	return 4
}

// Unit is the unit of a panel's values, named by its Grafana unit ID.
type Unit string

const (
	Short        Unit = "short"       // a plain number
	PercentUnit  Unit = "percentunit" // 0..1 shown as a percentage
	ReqPerSec    Unit = "reqps"       // requests (acquisitions, invocations) per second
	OpsPerSec    Unit = "ops"         // operations per second
	EventsPerSec Unit = "eps"         // events (errors, admission decisions) per second
	Seconds      Unit = "s"
)

// Panel is one panel.
type Panel struct {
	Kind               Kind
	Title, Description string
	Unit               Unit
	// Decimals fixes the number of decimals shown (nil: automatic).
	Decimals *int
	// Thresholds color a Stat's value (zero: always green).
	Thresholds Thresholds
	// Stacked stacks a TimeSeries' series into areas that sum up.
	Stacked bool
	// LegendRight puts a TimeSeries' legend at its right, one series a
	// line: for panels with many series, whose legend below the chart
	// would be cut off.
	LegendRight bool
	// Width in grid columns (of 24).
	Width int
	// HideColumns are the labels a Table does not show.
	HideColumns []string
	Queries     []Query
}

// Query is one PromQL query; Legend names each series ({{label}}
// templates; empty: automatic).
type Query struct{ Expr, Legend string }

// Thresholds: values below the first step are Base, from each step's value
// on its color. Colors are named: green, orange, red.
type Thresholds struct {
	Base  string
	Steps []Step
}

// Step starts a color at a value.
type Step struct {
	Value float64
	Color string
}

func decimals(n int) *int { return &n }

// Dashboards is what the chart ships.
var Dashboards = []Dashboard{
	{
		File: "node", UID: "cpuslot-node", Title: "cpuslot / Node",
		Description: "cpuslot node agents: pools, slots, acquisitions, latency, per-action CPU and throttling, admission, errors.",
		Link:        "cpuslot-runtime",
		Job:         JobVar{Name: "agent_job", Default: "cpuslot-node-agent"},
		Vars: []ListVar{
			// The cluster label a multi-cluster Prometheus (Thanos, Mimir)
			// adds; without one the variable is empty and All matches.
			{Name: "cluster", Label: "Cluster", Selector: `cpuslot_agent_info{job="$agent_job"}`, LabelName: "cluster"},
			{Name: "node", Label: "Node", Selector: `cpuslot_agent_info{job="$agent_job", cluster=~"$cluster"}`, LabelName: "node"},
			// A served container's series carry its namespace, pod and
			// container name apart, as cAdvisor's and kube-state-metrics' do.
			{Name: "namespace", Label: "Namespace", Selector: `cpuslot_slots{job="$agent_job", cluster=~"$cluster", node=~"$node"}`, LabelName: "namespace"},
			{Name: "pod", Label: "Pod", Selector: `cpuslot_slots{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace"}`, LabelName: "pod"},
			{Name: "container", Label: "Container", Selector: `cpuslot_slots{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod"}`, LabelName: "container"},
		},
		Rows: []Row{
			{Title: "Overview", Panels: []Panel{
				{
					Kind: Stat, Width: 4, Title: "Agents up", Unit: Short, Thresholds: Thresholds{Base: "red", Steps: []Step{{1, "green"}}},
					Description: "Agent pods scraped and up (up == 1). Fewer than nodes: see the DaemonSet.",
					Queries:     []Query{{Expr: `sum(up{job="$agent_job", cluster=~"$cluster", node=~"$node"})`}},
				},
				{
					Kind: Stat, Width: 4, Title: "Containers served", Unit: Short,
					Description: "Runtime containers with a pool on the selected nodes.",
					Queries:     []Query{{Expr: `sum(cpuslot_containers{job="$agent_job", cluster=~"$cluster", node=~"$node"})`}},
				},
				{
					Kind: Stat, Width: 4, Title: "Leases held", Unit: Short,
					Description: "Slots leased to invocations right now.",
					Queries:     []Query{{Expr: `sum(cpuslot_leases{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"})`}},
				},
				{
					Kind: Stat, Width: 4, Title: "Client connections", Unit: Short,
					Description: "Open connections from runtimes to the agents.",
					Queries:     []Query{{Expr: `sum(cpuslot_connections{job="$agent_job", cluster=~"$cluster", node=~"$node"})`}},
				},
				{
					Kind: Stat, Width: 4, Title: "No cgroup write", Unit: PercentUnit, Decimals: decimals(1),
					Description: "Share of acquisitions that found the thread already in a free slot of its quota (affinity_hit): no cgroup write at all. With local leasing (the default) only a runtime's misses reach the agent: its invocations are counted in cpuslot_lease_releases_total from its USAGE reports.",
					Queries:     []Query{{Expr: `sum(rate(cpuslot_acquisitions_total{job="$agent_job", cluster=~"$cluster", node=~"$node", outcome="affinity_hit"}[$__rate_interval])) / sum(rate(cpuslot_acquisitions_total{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval]))`}},
				},
				{
					Kind: Stat, Width: 4, Title: "Errors /s", Unit: EventsPerSec, Decimals: decimals(2), Thresholds: Thresholds{Base: "green", Steps: []Step{{0.01, "orange"}, {0.05, "red"}}},
					Description: "cpuslot_errors_total, every reason (0 when none was ever counted).",
					Queries:     []Query{{Expr: `sum(rate(cpuslot_errors_total{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval])) or vector(0)`}},
				},
				{
					Kind: Table, Width: 16, Title: "Agents",
					Description: "One row per agent: cgroup hierarchy of the node (v1/v2), favordynmods, agent version.",
					HideColumns: []string{"Time", "Value", "__name__", "job", "endpoint", "service", "namespace", "container"},
					Queries:     []Query{{Expr: `cpuslot_agent_info{job="$agent_job", cluster=~"$cluster", node=~"$node"}`}},
				},
				{
					Kind: Stat, Width: 4, Title: "Oldest agent uptime", Unit: Seconds, Decimals: decimals(0),
					Description: "Time since the longest-running selected agent started (process_start_time_seconds).",
					Queries:     []Query{{Expr: `max(time() - process_start_time_seconds{job="$agent_job", cluster=~"$cluster", node=~"$node"})`}},
				},
				{
					Kind: Stat, Width: 4, Title: "Newest agent uptime", Unit: Seconds, Decimals: decimals(0),
					Description: "Time since the most recently (re)started agent started: a small value means a restart.",
					Queries:     []Query{{Expr: `min(time() - process_start_time_seconds{job="$agent_job", cluster=~"$cluster", node=~"$node"})`}},
				},
			}},
			{Title: "Pools and slots", Panels: []Panel{
				{
					Kind: TimeSeries, Width: 12, Title: "Slots by state", Unit: Short, Stacked: true,
					Description: "Slots in the pools: free (ready), leased (held by an invocation), busy (being prepared, retuned or removed).",
					Queries:     []Query{{Expr: `sum by (state) (cpuslot_slots{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"})`, Legend: "{{state}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Slots by quota and state", LegendRight: true, Unit: Short,
					Description: "Pre-warmed and grown slots per quota (millicores).",
					Queries:     []Query{{Expr: `sum by (quota, state) (cpuslot_slots{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"})`, Legend: "{{quota}} {{state}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Leases per container", Unit: Short,
					Description: "Leases held per runtime container (namespace/pod/container).",
					Queries:     []Query{{Expr: `sum by (namespace, pod, container) (cpuslot_leases{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"})`, Legend: "{{namespace}}/{{pod}}/{{container}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "CPU budget per container", Unit: Short,
					Description: "Admission budget (the container's CPU limit x overcommit, or the configured budget; 0 = unlimited) and the quota granted to leases now, in CPUs.",
					Queries: []Query{
						{Expr: `sum by (namespace, pod, container) (cpuslot_budget_used_cores{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"})`, Legend: "{{namespace}}/{{pod}}/{{container}} granted"},
						{Expr: `sum by (namespace, pod, container) (cpuslot_budget_cores{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"})`, Legend: "{{namespace}}/{{pod}}/{{container}} budget"},
					},
				},
			}},
			{Title: "Acquisitions and latency", Panels: []Panel{
				{
					Kind: TimeSeries, Width: 12, Title: "Acquisitions by outcome", Unit: ReqPerSec, Stacked: true,
					Description: "Granted acquisitions per second by how the slot was found: affinity_hit (no cgroup write), cache_hit, retuned, created, reclaimed (re-declared after an agent restart). With local leasing (the default) only a runtime's misses reach the agent: its invocations are counted in cpuslot_lease_releases_total from its USAGE reports.",
					Queries:     []Query{{Expr: `sum by (outcome) (rate(cpuslot_acquisitions_total{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval]))`, Legend: "{{outcome}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Acquire latency (agent side)", Unit: Seconds,
					Description: "Time from a request to the agent's answer: p50, p90, p99 over the selected agents.",
					Queries: []Query{
						{Expr: `histogram_quantile(0.5, sum by (le) (rate(cpuslot_acquire_duration_seconds_bucket{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval])))`, Legend: "p50"},
						{Expr: `histogram_quantile(0.9, sum by (le) (rate(cpuslot_acquire_duration_seconds_bucket{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval])))`, Legend: "p90"},
						{Expr: `histogram_quantile(0.99, sum by (le) (rate(cpuslot_acquire_duration_seconds_bucket{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval])))`, Legend: "p99"},
					},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Acquire latency p99 by mode", Unit: Seconds,
					Description: "p99 per pool mode (affinity, cache-lazy, cache-eager, uncached).",
					Queries:     []Query{{Expr: `histogram_quantile(0.99, sum by (mode, le) (rate(cpuslot_acquire_duration_seconds_bucket{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval])))`, Legend: "{{mode}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Placement by the agent", Unit: Seconds,
					Description: "Thread placements the agent does itself (numeric TID writes: cache-lazy, cache-eager, uncached); in affinity mode threads place themselves and this stays empty.",
					Queries: []Query{
						{Expr: `histogram_quantile(0.5, sum by (le) (rate(cpuslot_placement_duration_seconds_bucket{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval])))`, Legend: "p50"},
						{Expr: `histogram_quantile(0.99, sum by (le) (rate(cpuslot_placement_duration_seconds_bucket{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval])))`, Legend: "p99"},
					},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "cgroup operation latency p99", Unit: Seconds,
					Description: "p99 of each cgroup file operation: mkdir, set_quota, place, move_out, rmdir, read_stat.",
					Queries:     []Query{{Expr: `histogram_quantile(0.99, sum by (operation, le) (rate(cpuslot_cgroup_operation_duration_seconds_bucket{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval])))`, Legend: "{{operation}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "cgroup operations", Unit: OpsPerSec,
					Description: "cgroup file operations per second.",
					Queries:     []Query{{Expr: `sum by (operation) (rate(cpuslot_cgroup_operation_duration_seconds_count{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval]))`, Legend: "{{operation}}"}},
				},
			}},
			{Title: "Invocations per action", Panels: []Panel{
				{
					Kind: TimeSeries, Width: 12, Title: "Released leases by outcome", Unit: ReqPerSec, Stacked: true,
					Description: "ok, failed, timeout, placement_failed, abandoned (the client went away holding it), superseded.",
					Queries:     []Query{{Expr: `sum by (outcome) (rate(cpuslot_lease_releases_total{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"}[$__rate_interval]))`, Legend: "{{outcome}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "CPU per action", LegendRight: true, Unit: Short,
					Description: "CPU used in slots while leased, in cores, top 10 actions (each action of each container: tenants' actions of the same name are apart).",
					Queries:     []Query{{Expr: `topk(10, sum by (namespace, pod, container, action) (rate(cpuslot_invocation_cpu_seconds_total{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"}[$__rate_interval])))`, Legend: "{{namespace}}/{{pod}}/{{container}} {{action}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Throttled time per action", LegendRight: true, Unit: Short,
					Description: "Time slots were throttled while leased (seconds per second), top 10 actions: an action hitting its quota.",
					Queries:     []Query{{Expr: `topk(10, sum by (namespace, pod, container, action) (rate(cpuslot_invocation_throttled_seconds_total{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"}[$__rate_interval])))`, Legend: "{{namespace}}/{{pod}}/{{container}} {{action}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "CPU and throttling per invocation", LegendRight: true, Unit: Seconds,
					Description: "Average CPU seconds and throttled seconds per released lease, by container and action.",
					Queries: []Query{
						{Expr: `sum by (namespace, pod, container, action) (rate(cpuslot_invocation_cpu_seconds_total{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"}[$__rate_interval])) / sum by (namespace, pod, container, action) (rate(cpuslot_lease_releases_total{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"}[$__rate_interval]))`, Legend: "{{namespace}}/{{pod}}/{{container}} {{action}} cpu"},
						{Expr: `sum by (namespace, pod, container, action) (rate(cpuslot_invocation_throttled_seconds_total{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"}[$__rate_interval])) / sum by (namespace, pod, container, action) (rate(cpuslot_lease_releases_total{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"}[$__rate_interval]))`, Legend: "{{namespace}}/{{pod}}/{{container}} {{action}} throttled"},
					},
				},
			}},
			{Title: "Admission and errors", Panels: []Panel{
				{
					Kind: TimeSeries, Width: 12, Title: "Admission events", Unit: EventsPerSec,
					Description: "Acquisitions that did not fit the container's CPU budget at once: queued, degraded (granted a smaller quota), rejected, timeout (queued past their wait budget).",
					Queries:     []Query{{Expr: `sum by (result) (rate(cpuslot_admission_total{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval]))`, Legend: "{{result}}"}},
				},
				{
					Kind: TimeSeries, Width: 6, Title: "Refused share", Unit: PercentUnit,
					Description: "Rejected + timed out / (granted + rejected + timed out).",
					Queries:     []Query{{Expr: `sum(rate(cpuslot_admission_total{job="$agent_job", cluster=~"$cluster", node=~"$node", result=~"rejected|timeout"}[$__rate_interval])) / (sum(rate(cpuslot_acquisitions_total{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval])) + sum(rate(cpuslot_admission_total{job="$agent_job", cluster=~"$cluster", node=~"$node", result=~"rejected|timeout"}[$__rate_interval])))`, Legend: "refused"}},
				},
				{
					Kind: TimeSeries, Width: 6, Title: "Budget granted", Unit: PercentUnit,
					Description: "Quota granted to leases / budget, per container with a budget.",
					Queries:     []Query{{Expr: `sum by (namespace, pod, container) (cpuslot_budget_used_cores{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"}) / sum by (namespace, pod, container) (cpuslot_budget_cores{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"} > 0)`, Legend: "{{namespace}}/{{pod}}/{{container}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Errors by reason", LegendRight: true, Unit: EventsPerSec,
					Description: "cpuslot_errors_total by reason (cgroup_<operation> for failed cgroup writes). See docs/operating.md, Troubleshooting.",
					Queries:     []Query{{Expr: `sum by (reason) (rate(cpuslot_errors_total{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval]))`, Legend: "{{reason}}"}},
				},
			}},
			{Title: "Lending", Panels: []Panel{
				{
					Kind: TimeSeries, Width: 8, Title: "Quota lent (CPUs)", Unit: Short, Stacked: true,
					Description: "Quota that sleeping leases lend to admission now, per container (admission.lendRatio; zero with lending off). See docs/lending.md.",
					Queries:     []Query{{Expr: `sum by (namespace, pod, container) (cpuslot_lent_cores{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"})`, Legend: "{{namespace}}/{{pod}}/{{container}}"}},
				},
				{
					Kind: TimeSeries, Width: 8, Title: "Lends and give-backs", Unit: OpsPerSec,
					Description: "Sleeps that lent quota, lent quotas given back (a wake or the sleeper's release), and awake leases cut to give a waker its quota back.",
					Queries: []Query{
						{Expr: `sum(rate(cpuslot_lends_total{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"}[$__rate_interval]))`, Legend: "lends"},
						{Expr: `sum(rate(cpuslot_givebacks_total{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"}[$__rate_interval]))`, Legend: "give-backs"},
						{Expr: `sum(rate(cpuslot_lend_cuts_total{job="$agent_job", cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod", container=~"$container"}[$__rate_interval]))`, Legend: "borrowers cut"},
					},
				},
				{
					Kind: TimeSeries, Width: 8, Title: "Wake to quota", Unit: Seconds,
					Description: "From a sleeping lease's WAKE to its whole quota back (its borrowers cut): p50 and p99 over the selected agents.",
					Queries: []Query{
						{Expr: `histogram_quantile(0.5, sum by (le) (rate(cpuslot_wake_to_quota_seconds_bucket{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval])))`, Legend: "p50"},
						{Expr: `histogram_quantile(0.99, sum by (le) (rate(cpuslot_wake_to_quota_seconds_bucket{job="$agent_job", cluster=~"$cluster", node=~"$node"}[$__rate_interval])))`, Legend: "p99"},
					},
				},
			}},
		},
	},
	{
		File: "runtime", UID: "cpuslot-runtime", Title: "cpuslot / Runtime",
		Description: "cpuslot runtime pods (runtime image metrics on :9102): invocations, latency, slot outcomes, per-function CPU and throttling, quota problems.",
		Link:        "cpuslot-node",
		Job:         JobVar{Name: "runtime_job", Default: "cpuslot-runtime"},
		Vars: []ListVar{
			{Name: "cluster", Label: "Cluster", Selector: `cpuslot_invocations_in_flight{job="$runtime_job"}`, LabelName: "cluster"},
			{Name: "namespace", Label: "Namespace", Selector: `cpuslot_invocations_in_flight{job="$runtime_job", cluster=~"$cluster"}`, LabelName: "namespace"},
			{Name: "function", Label: "Function", Selector: `cpuslot_invocations_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"}`, LabelName: "function"},
		},
		Rows: []Row{
			{Title: "Overview", Panels: []Panel{
				{
					Kind: Stat, Width: 4, Title: "Invocations /s", Unit: ReqPerSec, Decimals: decimals(2),
					Description: "Invocations finished per second (all platforms and statuses).",
					Queries:     []Query{{Expr: `sum(rate(cpuslot_invocations_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval]))`}},
				},
				{
					Kind: Stat, Width: 4, Title: "In flight", Unit: Short,
					Description: "Invocations running now.",
					Queries:     []Query{{Expr: `sum(cpuslot_invocations_in_flight{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"})`}},
				},
				{
					Kind: Stat, Width: 4, Title: "Without a slot", Unit: PercentUnit, Decimals: decimals(1), Thresholds: Thresholds{Base: "green", Steps: []Step{{0.01, "orange"}, {0.05, "red"}}},
					Description: "Invocations that had a quota but ran without a slot (fail-open: agent unreachable, budget, rejected...).",
					Queries:     []Query{{Expr: `(sum(rate(cpuslot_slot_outcomes_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", outcome=~"noslot_.*"}[$__rate_interval])) or vector(0)) / sum(rate(cpuslot_slot_outcomes_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", outcome!="no_quota"}[$__rate_interval]))`}},
				},
				{
					Kind: Stat, Width: 4, Title: "Runtime pods", Unit: Short,
					Description: "Runtime pods scraped and up.",
					Queries:     []Query{{Expr: `sum(up{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"})`}},
				},
				{
					Kind: Stat, Width: 4, Title: "Slot CPU (cores)", Unit: Short, Decimals: decimals(2),
					Description: "CPU used in slots, in cores.",
					Queries:     []Query{{Expr: `sum(rate(cpuslot_slot_cpu_seconds_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval]))`}},
				},
				{
					Kind: Stat, Width: 4, Title: "Slot throttled (s/s)", Unit: Short, Decimals: decimals(2),
					Description: "Time slots were throttled.",
					Queries:     []Query{{Expr: `sum(rate(cpuslot_slot_throttled_seconds_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval]))`}},
				},
			}},
			{Title: "Invocations", Panels: []Panel{
				{
					Kind: TimeSeries, Width: 12, Title: "Invocations by platform and status", Unit: ReqPerSec,
					Description: "openwhisk, knative, hydra; ok, error, timeout...",
					Queries:     []Query{{Expr: `sum by (platform, status) (rate(cpuslot_invocations_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval]))`, Legend: "{{platform}} {{status}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Invocation latency (runtime)", Unit: Seconds,
					Description: "Invocation time inside the runtime: p50, p90, p99.",
					Queries: []Query{
						{Expr: `histogram_quantile(0.5, sum by (le) (rate(cpuslot_invocation_duration_seconds_bucket{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval])))`, Legend: "p50"},
						{Expr: `histogram_quantile(0.9, sum by (le) (rate(cpuslot_invocation_duration_seconds_bucket{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval])))`, Legend: "p90"},
						{Expr: `histogram_quantile(0.99, sum by (le) (rate(cpuslot_invocation_duration_seconds_bucket{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval])))`, Legend: "p99"},
					},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Latency p99 by function", Unit: Seconds,
					Queries: []Query{{Expr: `histogram_quantile(0.99, sum by (function, le) (rate(cpuslot_invocation_duration_seconds_bucket{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval])))`, Legend: "{{function}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Sandboxes", Unit: Short,
					Description: "Workers (one sandbox each) busy and idle, and the configured maximum.",
					Queries: []Query{
						{Expr: `sum by (state) (cpuslot_sandboxes{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function", state!="max"})`, Legend: "{{state}}"},
						{Expr: `sum(cpuslot_sandboxes{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function", state="max"})`, Legend: "max"},
					},
				},
			}},
			{Title: "Slots", Panels: []Panel{
				{
					Kind: TimeSeries, Width: 12, Title: "Slot outcomes", Unit: ReqPerSec, Stacked: true,
					Description: "Per invocation: how the slot was found (affinity_hit, cache_hit, retuned, created), no_quota (no quota from any source), or noslot_<reason>.",
					Queries:     []Query{{Expr: `sum by (outcome) (rate(cpuslot_slot_outcomes_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"}[$__rate_interval]))`, Legend: "{{outcome}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Slot client events", LegendRight: true, Unit: OpsPerSec,
					Description: "The slot client's counters: acquire, place, release, reclaim, connect, fds, noslot.<reason>.",
					Queries:     []Query{{Expr: `sum by (event) (rate(cpuslot_slot_client_events_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"}[$__rate_interval]))`, Legend: "{{event}}"}},
				},
				{
					Kind: TimeSeries, Width: 24, Title: "Slot acquire latency (runtime)", Unit: Seconds,
					Description: "Time a worker took to acquire its slot, placement included, as the runtime measures it (cpuslot_slot_acquire_seconds): p50, p90, p99. The agent's share of it: cpuslot / Node, Acquire latency (agent side).",
					Queries: []Query{
						{Expr: `histogram_quantile(0.5, sum by (le) (rate(cpuslot_slot_acquire_seconds_bucket{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"}[$__rate_interval])))`, Legend: "p50"},
						{Expr: `histogram_quantile(0.9, sum by (le) (rate(cpuslot_slot_acquire_seconds_bucket{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"}[$__rate_interval])))`, Legend: "p90"},
						{Expr: `histogram_quantile(0.99, sum by (le) (rate(cpuslot_slot_acquire_seconds_bucket{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"}[$__rate_interval])))`, Legend: "p99"},
					},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Slot CPU by function", Unit: Short,
					Description: "CPU used in slots, in cores.",
					Queries:     []Query{{Expr: `sum by (function) (rate(cpuslot_slot_cpu_seconds_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval]))`, Legend: "{{function}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Slot throttled time by function", Unit: Short,
					Description: "Time slots were throttled (seconds per second).",
					Queries:     []Query{{Expr: `sum by (function) (rate(cpuslot_slot_throttled_seconds_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval]))`, Legend: "{{function}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Idle ratio by function", Unit: PercentUnit,
					Description: "Share of the CPU reserved by a function's slot leases (granted quota x time held) that its invocations did not use: 1 - slot CPU / reserved, over 1 minute (a batch's CPU is counted up to a second after its invocations' reserved time; below 0 is that skew, drawn as 0). See docs/lending.md, Metrics.",
					Queries:     []Query{{Expr: `clamp_min(1 - sum by (function) (rate(cpuslot_slot_cpu_seconds_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[1m])) / sum by (function) (rate(cpuslot_slot_reserved_seconds_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[1m])), 0)`, Legend: "{{function}}"}},
				},
				{
					Kind: TimeSeries, Width: 12, Title: "Lent time by function", Unit: Short,
					Description: "Time a function's leases slept in synchronous chain calls, when the agent may lend their quota (seconds per second: the leases asleep on average). Zero while the pod or the action does not lend.",
					Queries:     []Query{{Expr: `sum by (function) (rate(cpuslot_slot_slept_seconds_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval]))`, Legend: "{{function}}"}},
				},
			}},
			{Title: "Quotas and problems", Panels: []Panel{
				{
					Kind: TimeSeries, Width: 8, Title: "OpenWhisk annotation lookups", Unit: OpsPerSec,
					Description: "Reads of the action's cpu-quota annotation from the OpenWhisk API (once per action version), and failed ones.",
					Queries: []Query{
						{Expr: `sum(rate(cpuslot_annotation_lookups_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"}[$__rate_interval]))`, Legend: "lookups"},
						{Expr: `sum(rate(cpuslot_annotation_errors_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"}[$__rate_interval]))`, Legend: "errors"},
					},
				},
				{
					Kind: TimeSeries, Width: 8, Title: "Quota values refused or capped", Unit: OpsPerSec,
					Description: "Quotas that did not parse (the invocation is refused with 400) or were above CPUSLOT_MAX_QUOTA_MILLI, by source.",
					Queries: []Query{
						{Expr: `sum by (source) (rate(cpuslot_quota_invalid_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"}[$__rate_interval]))`, Legend: "invalid {{source}}"},
						{Expr: `sum by (source) (rate(cpuslot_quota_capped_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"}[$__rate_interval]))`, Legend: "capped {{source}}"},
					},
				},
				{
					Kind: TimeSeries, Width: 8, Title: "Bad requests and abandoned sandboxes", Unit: OpsPerSec,
					Description: "Requests refused before running anything, by reason; workers retired at a deadline; sandboxes created.",
					Queries: []Query{
						{Expr: `sum by (reason) (rate(cpuslot_bad_requests_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace"}[$__rate_interval]))`, Legend: "{{reason}}"},
						{Expr: `sum(rate(cpuslot_sandboxes_abandoned_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval]))`, Legend: "sandboxes abandoned"},
						{Expr: `sum(rate(cpuslot_sandboxes_created_total{job="$runtime_job", cluster=~"$cluster", namespace=~"$namespace", function=~"$function"}[$__rate_interval]))`, Legend: "sandboxes created"},
					},
				},
			}},
		},
	},
}
