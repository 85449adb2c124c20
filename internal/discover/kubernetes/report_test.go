package kubernetes

import (
	"strings"
	"testing"

	"k8s.io/client-go/tools/record"

	"github.com/cpuslot/cpuslot/internal/discover"
)

// TestReportOnServedPod: a report about a cgroup goes to the served pod
// whose container holds it, and to no one when none does.
func TestReportOnServedPod(t *testing.T) {
	rec := record.NewFakeRecorder(4)
	s := &Source{recorder: rec, served: map[string]servedPod{
		"uid-a": {key: "ns/a", cgroupPath: "/kubepods/pod-a/ctr"},
		"uid-b": {key: "ns/b", cgroupPath: "/kubepods/pod-b/ctr"},
	}}
	var _ discover.Reporter = s
	s.Report("/kubepods/pod-b/ctr", discover.ReasonForeignThread, "thread 7 wrote itself into a slot of ns/a")
	s.Report("/kubepods/pod-a/ctr/cpuslot-3", discover.ReasonForeignThread, "a foreign thread ran in slot cpuslot-3")
	s.Report("/system.slice/x.service", discover.ReasonForeignThread, "not ours")
	s.Report("/kubepods/pod-a/ctrX", discover.ReasonForeignThread, "not ours either")
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		got = append(got, e)
	}
	want := []string{
		"Warning CpuslotForeignThread thread 7 wrote itself into a slot of ns/a",
		"Warning CpuslotForeignThread a foreign thread ran in slot cpuslot-3",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
