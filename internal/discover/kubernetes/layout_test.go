package kubernetes

import (
	"context"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
)

// TestUnrecognisedCgroupLayout: a selected pod whose container cgroup the
// agent cannot place in the node's hierarchy (containerd names it in a form
// neither cgroup driver writes, or names a cgroup that is not there, as on
// a node mounting its hierarchy elsewhere) gets a Warning Event saying so,
// a log line, and no pool: nothing is made anywhere in the hierarchy.
// Client-go's fake API stands in for the API server; agent and cgroups are
// real.
func TestUnrecognisedCgroupLayout(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 1000)
	parent := filepath.Dir(rel)
	for _, tc := range []struct {
		name, cgroupsPath, reason, says string
	}{
		{"unknown-form", "kubepods:cri-containerd", ReasonCgroupNotFound, "neither a path nor slice:prefix:name"},
		{"not-there", parent + "/elsewhere/ctr", ReasonPrepareFailed, "no such file or directory"},
		{"bad-slice", "kubepods-.slice:cri-containerd:c1", ReasonCgroupNotFound, "bad slice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewSimpleClientset(selectedPod("uid-l", "250m=2", corev1.ResourceRequirements{}))
			logs := &syncWriter{}
			a, _ := runAgent(t, h, cs, Selector{Annotated: true}, "uid-l", logs,
				func(context.Context, string) (string, error) { return CgroupFromSpec(tc.cgroupsPath) })
			ctx := context.Background()
			var msg string
			waitUntil(t, "a Warning "+tc.reason+" event", func() bool {
				ev, _ := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
				for _, e := range ev.Items {
					if e.Type == corev1.EventTypeWarning && e.Reason == tc.reason && strings.Contains(e.Message, tc.says) {
						msg = e.Message
						return true
					}
				}
				return false
			})
			t.Logf("event %s: %s", tc.reason, msg)
			if s := a.Summaries(); len(s) != 0 {
				t.Fatalf("the agent serves %+v", s)
			}
			var made []string
			filepath.WalkDir(filepath.Join(h.CPURoot, parent), func(p string, d fs.DirEntry, err error) error {
				if _, slot := cgroup.ParseSlotName(d.Name()); err == nil && d.IsDir() && slot {
					made = append(made, p)
				}
				return nil
			})
			if len(made) != 0 {
				t.Fatalf("slots made: %v", made)
			}
			waitUntil(t, "a log line", func() bool { return strings.Contains(logs.String(), tc.says) })
		})
	}
}
