package metrics

import "github.com/prometheus/client_golang/prometheus"

// Pool is one container's pool as a scrape sees it.
type Pool struct {
	Container   string
	BudgetMilli uint32
	UsedMilli   uint32
	Leases      int
	// LentMilli is what sleeping leases lend now; since the pool started,
	// Wakes counts the wakes of sleeping leases, Lends the sleeps that lent
	// quota, GiveBacks the lent quotas that ended, Cuts the awake leases
	// lowered by wakes.
	LentMilli                     uint32
	Wakes, Lends, GiveBacks, Cuts uint64
	Quotas                        []Quota
}

// Quota counts the slots of one quota of a pool.
type Quota struct {
	Quota               string // as configured, e.g. "250m"
	Free, Leased, Slots int
}

var (
	slotsDesc = prometheus.NewDesc("cpuslot_slots", "Slots by container, quota and state (free, leased, busy).",
		withContainer("quota", "state"), nil)
	budgetDesc = prometheus.NewDesc("cpuslot_budget_cores", "Admission budget per container, in CPUs (0: unlimited).",
		containerLabels, nil)
	usedDesc = prometheus.NewDesc("cpuslot_budget_used_cores", "CPU quota granted to leases now, per container, in CPUs.",
		containerLabels, nil)
	// The same in millicores, kept for one release (deprecated).
	budgetMilliDesc = prometheus.NewDesc("cpuslot_budget_millicores", "Deprecated: cpuslot_budget_cores x 1000; removed in the next release.",
		containerLabels, nil)
	usedMilliDesc = prometheus.NewDesc("cpuslot_budget_used_millicores", "Deprecated: cpuslot_budget_used_cores x 1000; removed in the next release.",
		containerLabels, nil)
	lentMilliDesc = prometheus.NewDesc("cpuslot_lent_millicores", "Deprecated: cpuslot_lent_cores x 1000; removed in the next release.",
		containerLabels, nil)
	leasesDesc = prometheus.NewDesc("cpuslot_leases", "Leases held now, per container.", containerLabels, nil)
	lentDesc   = prometheus.NewDesc("cpuslot_lent_cores", "Quota sleeping leases lend to admission now, per container, in CPUs (admission.lendRatio; not in cpuslot_budget_used_cores).",
		containerLabels, nil)
	wakesDesc = prometheus.NewDesc("cpuslot_wakes_total", "Sleeping leases woken (WAKE), per container; a wake that puts the container over its budget degrades the youngest awake leases.",
		containerLabels, nil)
	lendsDesc = prometheus.NewDesc("cpuslot_lends_total", "Sleeps (SLEEP) that lent quota to admission, per container.",
		containerLabels, nil)
	giveBacksDesc = prometheus.NewDesc("cpuslot_givebacks_total", "Lent quotas that ended, by the sleeper's WAKE or release, per container; cpuslot_lends_total minus this is the leases lending now.",
		containerLabels, nil)
	cutsDesc = prometheus.NewDesc("cpuslot_lend_cuts_total", "Awake leases lowered (degraded) to give a waking lease its quota back, per container.",
		containerLabels, nil)
	poolsDesc = prometheus.NewDesc("cpuslot_containers", "Containers served.", nil, nil)
	maxDesc   = prometheus.NewDesc("cpuslot_containers_max", "The most containers the agent serves (maxContainers); more are refused and counted as errors with reason "+string(ContainersExhausted)+".", nil, nil)
)

// poolCollector exports pool state at scrape time.
type poolCollector struct {
	maxContainers int
	pools         func() []Pool
}

// RegisterPools exports the state of the served pools, read from pools at
// each scrape; maxContainers is the most the agent serves.
func RegisterPools(reg prometheus.Registerer, maxContainers int, pools func() []Pool) {
	reg.MustRegister(poolCollector{maxContainers, pools})
}

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{slotsDesc, budgetDesc, usedDesc, leasesDesc, lentDesc, wakesDesc, lendsDesc, giveBacksDesc, cutsDesc, poolsDesc, maxDesc,
		budgetMilliDesc, usedMilliDesc, lentMilliDesc} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	pools := c.pools()
	ch <- ConstGauge(poolsDesc, float64(len(pools)))
	ch <- ConstGauge(maxDesc, float64(c.maxContainers))
	for _, p := range pools {
		c := containerValues(p.Container)
		with := func(more ...string) []string { return append(append([]string(nil), c...), more...) }
		for _, q := range p.Quotas {
			ch <- ConstGauge(slotsDesc, float64(q.Free), with(q.Quota, "free")...)
			ch <- ConstGauge(slotsDesc, float64(q.Leased), with(q.Quota, "leased")...)
			ch <- ConstGauge(slotsDesc, float64(q.Slots-q.Free-q.Leased), with(q.Quota, "busy")...)
		}
		ch <- ConstGauge(budgetDesc, float64(p.BudgetMilli)/1000, with()...)
		ch <- ConstGauge(usedDesc, float64(p.UsedMilli)/1000, with()...)
		ch <- ConstGauge(leasesDesc, float64(p.Leases), with()...)
		ch <- ConstGauge(lentDesc, float64(p.LentMilli)/1000, with()...)
		ch <- ConstGauge(budgetMilliDesc, float64(p.BudgetMilli), with()...)
		ch <- ConstGauge(usedMilliDesc, float64(p.UsedMilli), with()...)
		ch <- ConstGauge(lentMilliDesc, float64(p.LentMilli), with()...)
		ch <- prometheus.MustNewConstMetric(wakesDesc, prometheus.CounterValue, float64(p.Wakes), c...)
		ch <- prometheus.MustNewConstMetric(lendsDesc, prometheus.CounterValue, float64(p.Lends), c...)
		ch <- prometheus.MustNewConstMetric(giveBacksDesc, prometheus.CounterValue, float64(p.GiveBacks), c...)
		ch <- prometheus.MustNewConstMetric(cutsDesc, prometheus.CounterValue, float64(p.Cuts), c...)
	}
}
