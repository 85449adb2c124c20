package metrics

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestPoolGauges: the scrape-time pool state keeps the names and labels
// the dashboards and alert rules query.
func TestPoolGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	RegisterPools(reg, 7, func() []Pool {
		return []Pool{{Container: "ns/pod/c", BudgetMilli: 1000, UsedMilli: 250, Leases: 1, LentMilli: 125, Wakes: 3, Lends: 5, GiveBacks: 4, Cuts: 2,
			Quotas: []Quota{{Quota: "250m", Free: 2, Leased: 1, Slots: 4}}}}
	})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
			}
			got = append(got, fmt.Sprintf("%s{%s} %v", mf.GetName(), strings.Join(ls, ","), v))
		}
	}
	want := []string{
		"cpuslot_budget_cores{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod} 1",
		"cpuslot_budget_millicores{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod} 1000",
		"cpuslot_budget_used_cores{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod} 0.25",
		"cpuslot_budget_used_millicores{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod} 250",
		"cpuslot_containers{} 1",
		"cpuslot_containers_max{} 7",
		"cpuslot_givebacks_total{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod} 4",
		"cpuslot_leases{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod} 1",
		"cpuslot_lend_cuts_total{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod} 2",
		"cpuslot_lends_total{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod} 5",
		"cpuslot_lent_cores{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod} 0.125",
		"cpuslot_lent_millicores{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod} 125",
		"cpuslot_slots{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod,quota=250m,state=busy} 1",
		"cpuslot_slots{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod,quota=250m,state=free} 2",
		"cpuslot_slots{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod,quota=250m,state=leased} 1",
		"cpuslot_wakes_total{container=c,cpuslot_container=ns/pod/c,namespace=ns,pod=pod} 3",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
