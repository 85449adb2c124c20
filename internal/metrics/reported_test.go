package metrics

import (
	"fmt"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// counter reads the counter name{labels} from reg (pairs of label name and
// value); -1 when it is not exported.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// TestReportedAnyValue: a USAGE report of the largest values is counted as
// sent (the client's word), not wrapped into a negative increment, which
// the Prometheus client refuses with a panic.
func TestReportedAnyValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Reported("a", EndOK, math.MaxUint32, math.MaxUint64, math.MaxUint64)
	if got, want := counter(t, reg, "cpuslot_invocation_cpu_seconds_total", "action", "a"), float64(uint64(math.MaxUint64))/1e9; got != want {
		t.Fatalf("cpu %v, want %v", got, want)
	}
	if got := counter(t, reg, "cpuslot_lease_releases_total", "action", "a", "outcome", "ok"); got != math.MaxUint32 {
		t.Fatalf("invocations %v", got)
	}
}

// TestHeldBypassesTheNodeCap: the agent's own _held series is counted under
// its name even when the node-wide cap on action names is used up.
func TestHeldBypassesTheNodeCap(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.SetMaxActions(3)
	for i := 0; i < 10; i++ {
		m.Reported(fmt.Sprintf("a%d", i), EndOK, 1, 0, 0)
	}
	m.Released(Held, EndOK, 0, 0)
	if got := counter(t, reg, "cpuslot_lease_releases_total", "action", Held, "outcome", "ok"); got != 1 {
		t.Fatalf("_held releases %v, want 1", got)
	}
	if got := counter(t, reg, "cpuslot_lease_releases_total", "action", "_other", "outcome", "ok"); got != 7 {
		t.Fatalf("_other %v, want 7", got)
	}
}
