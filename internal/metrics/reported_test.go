package metrics

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/internal/outcome"
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
	m.Reported("ns/pod/c", "a", outcome.EndOK, math.MaxUint32, math.MaxUint64, math.MaxUint64)
	if got, want := counter(t, reg, "cpuslot_invocation_cpu_seconds_total", "namespace", "ns", "pod", "pod", "container", "c", "action", "a"), float64(uint64(math.MaxUint64))/1e9; got != want {
		t.Fatalf("cpu %v, want %v", got, want)
	}
	if got := counter(t, reg, "cpuslot_lease_releases_total", "namespace", "ns", "pod", "pod", "container", "c", "action", "a", "outcome", "ok"); got != math.MaxUint32 {
		t.Fatalf("invocations %v", got)
	}
}

// TestHoldBypassesTheNodeCap: the agent's own _hold series is counted under
// its name even when the node-wide cap on action names is used up.
func TestHoldBypassesTheNodeCap(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.SetMaxActions(3)
	for i := 0; i < 10; i++ {
		m.Reported("c", fmt.Sprintf("a%d", i), outcome.EndOK, 1, 0, 0)
	}
	m.Released("c", outcome.HoldAction, outcome.EndOK, 0, 0)
	if got := counter(t, reg, "cpuslot_lease_releases_total", "container", "c", "action", outcome.HoldAction, "outcome", "ok"); got != 1 {
		t.Fatalf("_hold releases %v, want 1", got)
	}
	if got := counter(t, reg, "cpuslot_lease_releases_total", "container", "c", "action", "_other", "outcome", "ok"); got != 7 {
		t.Fatalf("_other %v, want 7", got)
	}
}

// TestActionSeriesPerContainer: the same action name in two containers is
// two series, so one container's counts never move another's; a
// container's series end with it, and free its names under the node cap.
func TestActionSeriesPerContainer(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.SetMaxActions(2)
	m.Reported("a", "act", outcome.EndOK, 1_000, 0, 0)
	m.Released("b", "act", outcome.EndOK, time.Second, 0)
	if got := counter(t, reg, "cpuslot_lease_releases_total", "container", "b", "action", "act", "outcome", "ok"); got != 1 {
		t.Fatalf("b's releases %v, want 1", got)
	}
	if got := counter(t, reg, "cpuslot_lease_releases_total", "container", "a", "action", "act", "outcome", "ok"); got != 1_000 {
		t.Fatalf("a's releases %v, want 1000", got)
	}
	m.Released("c", "act", outcome.EndOK, 0, 0) // the node cap (2) is used up
	if got := counter(t, reg, "cpuslot_lease_releases_total", "container", "c", "action", "_other", "outcome", "ok"); got != 1 {
		t.Fatalf("c's _other %v, want 1", got)
	}
	m.ForgetContainer("a")
	if got := counter(t, reg, "cpuslot_lease_releases_total", "container", "a"); got != -1 {
		t.Fatalf("a's series outlived it: %v", got)
	}
	if got := counter(t, reg, "cpuslot_invocation_cpu_seconds_total", "container", "a"); got != -1 {
		t.Fatalf("a's CPU series outlived it: %v", got)
	}
	m.Released("c", "act", outcome.EndOK, 0, 0) // a's name is free again
	if got := counter(t, reg, "cpuslot_lease_releases_total", "container", "c", "action", "act", "outcome", "ok"); got != 1 {
		t.Fatalf("c's act %v, want 1 once a's names were freed", got)
	}
}

// labelsOf reads the labels of the first series of name in reg.
func labelsOf(t *testing.T, reg *prometheus.Registry, name string) map[string]string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			have := map[string]string{}
			for _, l := range mf.GetMetric()[0].GetLabel() {
				if l.GetValue() != "" { // Prometheus stores an empty label as none
					have[l.GetName()] = l.GetValue()
				}
			}
			return have
		}
	}
	t.Fatalf("%s not exported", name)
	return nil
}

// TestContainerLabelsSplit: a served container's series carry namespace,
// pod and container (its name) apart, as cAdvisor and kube-state-metrics
// do, so they join; the combined name stays as cpuslot_container for one
// release. A standalone container (a cgroup path) has no namespace or pod:
// its container label is the path. Each part is a safe label on its own.
func TestContainerLabelsSplit(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		namespace, pod, container string
	}{
		{"ns/pod-1/fn", "ns", "pod-1", "fn"},
		{"/pods/x", "", "", "/pods/x"},
		{"/a/b/c", "", "", "/a/b/c"},
		{"ns/p\u202Eod/c\xff", "ns", "p?od", "c\uFFFD"},
	} {
		reg := prometheus.NewRegistry()
		m := New(reg)
		m.Released(tc.name, "act", outcome.EndOK, time.Millisecond, 0)
		got := labelsOf(t, reg, "cpuslot_lease_releases_total")
		want := map[string]string{"namespace": tc.namespace, "pod": tc.pod, "container": tc.container,
			LegacyContainerLabel: Label(tc.name), "action": "act", "outcome": "ok"}
		for k := range want {
			if want[k] == "" {
				delete(want, k) // an empty label is no label
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%q: labels %v, want %v", tc.name, got, want)
		}
		m.ForgetContainer(tc.name)
		if got := counter(t, reg, "cpuslot_lease_releases_total"); got != -1 {
			t.Errorf("%q: series outlived ForgetContainer", tc.name)
		}
	}
}
