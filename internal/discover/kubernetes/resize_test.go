package kubernetes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
)

// TestResizeBelowSlotQuota: the pod's spec lowers its served container's
// CPU limit (1 -> 400m, an in-place resize) while a 500m slot exists. The
// agent removes that slot before the kubelet writes the new limit, so the
// write succeeds: on cgroup v1 the kernel refuses a container quota below
// a child's (EINVAL), and the resize would fail for as long as the slot
// stayed. Then the spec and the cgroup grow back, and the slot returns.
// Client-go's fake API stands in for the API server; agent and cgroups are
// real.
func TestResizeBelowSlotQuota(t *testing.T) {
	h := cgrouptest.Kernel(t)
	rel := cgrouptest.NewContainer(t, h, 1000)
	limits := func(cpu string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}
	}
	cs := fake.NewSimpleClientset(selectedPod("uid-r", "250m=1,500m=1", limits("1")))
	a, _ := runAgent(t, h, cs, Selector{Annotated: true}, "uid-r", os.Stderr, func(context.Context, string) (string, error) { return rel, nil })
	ctx := context.Background()
	waitUntil(t, "agent ready", a.Ready)
	slots := func() string {
		m := map[uint32]int{}
		for _, s := range a.Summaries() {
			for _, q := range s.Quotas {
				if q.Slots > 0 {
					m[q.QuotaMilli] += q.Slots
				}
			}
		}
		return fmt.Sprint(m)
	}
	if got := slots(); got != "map[250:1 500:1]" {
		t.Fatalf("served with %s", got)
	}
	quotaFile, quota := filepath.Join(h.CPURoot, rel, "cpu.cfs_quota_us"), func(m int) string { return fmt.Sprint(m * 100) }
	if h.Version == 2 {
		quotaFile, quota = filepath.Join(h.CPURoot, rel, "cpu.max"), func(m int) string { return fmt.Sprintf("%d 100000", m*100) }
	}
	resize := func(cpu string) {
		t.Helper()
		p, err := cs.CoreV1().Pods("default").Get(ctx, "fn", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Spec.Containers[0].Resources = limits(cpu)
		if _, err := cs.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	resize("400m")
	waitUntil(t, "the 500m slot to go", func() bool { return slots() == "map[250:1]" })
	// The kubelet's write of the new limit now succeeds on v1 too (the
	// kernel unlinks a removed cgroup's group asynchronously: the first
	// write may still see it, and the kubelet retries as this does).
	var werr error
	defer func() {
		if werr != nil {
			t.Logf("last write: %v", werr)
		}
	}()
	waitUntil(t, "the container's new limit to be accepted", func() bool {
		werr = os.WriteFile(quotaFile, []byte(quota(400)), 0)
		return werr == nil
	})

	if err := os.WriteFile(quotaFile, []byte(quota(1000)), 0); err != nil {
		t.Fatal(err)
	}
	resize("1")
	// The spec alone does not raise what is served above the cgroup's
	// limit; the maintenance that reads the cgroup does.
	a.Maintain(time.Now())
	waitUntil(t, "the 500m slot to return", func() bool { return slots() == "map[250:1 500:1]" })
}
