package kubernetes

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cpuslot/cpuslot/internal/settings"
)

// ann is the pod annotation of a setting, read from settings.Keys.
func ann(key string) string {
	k, ok := settings.Lookup(key)
	if !ok || k.Annotation == "" {
		panic("no annotation for setting " + key)
	}
	return settings.AnnotationPrefix + k.Annotation
}

func pod(labels, annotations map[string]string, containers ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: labels, Annotations: annotations}}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c})
	}
	return p
}

func TestServedContainer(t *testing.T) {
	all := Selector{OpenWhisk: true, Knative: true, Annotated: true}
	cases := []struct {
		name string
		sel  Selector
		pod  *corev1.Pod
		want string
	}{
		{"openwhisk action pod", all, pod(map[string]string{"user-action-pod": "true", "invoker": "invoker0"}, nil, "user-action"), "user-action"},
		{"knative revision", all, pod(map[string]string{"serving.knative.dev/revision": "fn-00001"}, nil, "user-container", "queue-proxy"), "user-container"},
		{"annotated first container", all, pod(nil, map[string]string{AnnEnabled: "true"}, "app", "sidecar"), "app"},
		{"annotated named container", all, pod(nil, map[string]string{AnnEnabled: "true", AnnContainer: "sidecar"}, "app", "sidecar"), "sidecar"},
		{"opt-out wins", all, pod(map[string]string{"user-action-pod": "true"}, map[string]string{AnnEnabled: "false"}, "user-action"), ""},
		{"plain pod", all, pod(nil, nil, "app"), ""},
		{"knative not selected", Selector{OpenWhisk: true}, pod(map[string]string{"serving.knative.dev/revision": "x"}, nil, "user-container"), ""},
		{"annotation names a missing container", all, pod(nil, map[string]string{AnnEnabled: "true", AnnContainer: "nope"}, "app"), ""},
	}
	for _, c := range cases {
		if got, why := c.sel.ServedContainer(c.pod); got != c.want {
			t.Errorf("%s: got %q (%s), want %q", c.name, got, why, c.want)
		}
	}
	if _, err := ParseSelector([]string{"openwhisk", "bogus"}); err == nil {
		t.Error("bogus selector accepted")
	}
}

func TestPoolConfigAnnotations(t *testing.T) {
	base := settings.Default()
	c, errs := PoolConfig(base, settings.DefaultCeilings(), map[string]string{ann("pool.prewarm"): "500m=2", ann("pool.mode"): "cache-lazy", ann("admission.budget"): "1500m", ann("admission.policy"): "degrade", ann("admission.overcommit"): "1.5", ann("pool.maxSlots"): "16", ann("pool.limit"): "both"}, 0)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if c.Mode != "cache-lazy" || c.BudgetMilli != 1500 || c.MaxSlots != 16 || c.Overcommit != 1.5 || settings.FormatPrewarm(c.Prewarm) != "500m=2" {
		t.Fatalf("%+v", c)
	}
	// Garbage keeps the default for that field, and says why.
	c, errs = PoolConfig(base, settings.DefaultCeilings(), map[string]string{ann("pool.prewarm"): "lots", ann("pool.mode"): "fast", ann("admission.budget"): "-1", ann("admission.overcommit"): "0", ann("pool.maxSlots"): "x", ann("admission.policy"): "drop", ann("pool.limit"): "hard"}, 0)
	if len(errs) != 7 {
		t.Fatalf("want 7 errors, got %v", errs)
	}
	if settings.FormatPrewarm(c.Prewarm) != settings.FormatPrewarm(base.Prewarm) || c.Mode != base.Mode {
		t.Fatalf("defaults not kept: %+v", c)
	}
	// Valid fields that together are invalid fall back to the defaults.
	c, errs = PoolConfig(base, settings.DefaultCeilings(), map[string]string{ann("pool.prewarm"): "250m=10", ann("pool.maxSlots"): "4"}, 0)
	if len(errs) != 1 || c.MaxSlots != base.MaxSlots || !strings.Contains(errs[0].Error(), "defaults") {
		t.Fatalf("%v %+v", errs, c)
	}
}

func TestCgroupFromSpec(t *testing.T) {
	for in, want := range map[string]string{
		"/kubepods/burstable/pod1234/abcd":                      "/kubepods/burstable/pod1234/abcd",
		"kubepods-burstable-pod12_34.slice:cri-containerd:abcd": "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice/cri-containerd-abcd.scope",
		"kubepods-pod99.slice:cri-containerd:ef":                "/kubepods.slice/kubepods-pod99.slice/cri-containerd-ef.scope",
		"system.slice:docker:x":                                 "/system.slice/docker-x.scope",
		"-.slice:p:n":                                           "/p-n.scope",
	} {
		if got, err := CgroupFromSpec(in); err != nil || got != want {
			t.Errorf("%s: got %q %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a:b", "notaslice:p:n", "a--b.slice:p:n"} {
		if _, err := CgroupFromSpec(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestSocketPath(t *testing.T) {
	if got := SocketPath("/var/lib/kubelet/pods", "u-1", "cpuslot"); got != "/var/lib/kubelet/pods/u-1/volumes/kubernetes.io~empty-dir/cpuslot/agent.sock" {
		t.Fatal(got)
	}
}

// A revision's quota annotation (read by the runtime, e.g. through the
// downward API) above its container's CPU limit can never get a slot: the
// agent says so on the pod instead of leaving every invocation to run
// without one silently.
func TestCheckQuotaAnnotation(t *testing.T) {
	withLimit := func(annotations map[string]string, limit string) *corev1.Pod {
		p := pod(map[string]string{"serving.knative.dev/revision": "fn-00001"}, annotations, "user-container", "queue-proxy")
		if limit != "" {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(limit)}
		}
		return p
	}
	cases := []struct {
		name    string
		pod     *corev1.Pod
		wantErr string
	}{
		{"no annotation", withLimit(nil, "1"), ""},
		{"fits", withLimit(map[string]string{AnnCPUQuota: "250m"}, "1"), ""},
		{"equals the limit", withLimit(map[string]string{AnnCPUQuota: "1"}, "1"), ""},
		{"no limit", withLimit(map[string]string{AnnCPUQuota: "2"}, ""), ""},
		{"above the limit", withLimit(map[string]string{AnnCPUQuota: "2"}, "1"), "above container user-container's CPU limit 1000m"},
		{"unparsable", withLimit(map[string]string{AnnCPUQuota: "lots"}, "1"), `cpuslot.dev/cpu-quota="lots"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckQuotaAnnotation(c.pod, "user-container")
			if c.wantErr == "" && err != nil {
				t.Fatalf("unexpected %v", err)
			}
			if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("got %v, want an error with %q", err, c.wantErr)
			}
		})
	}
}

// A pod's annotations are hostile: a prewarm list of thousands of quotas
// with no slots each must not make every pool carry thousands of entries,
// and an oversized value must not be copied whole into the Event.
func TestPoolConfigHostileAnnotations(t *testing.T) {
	var entries []string
	for q := 10; q <= 1000; q++ {
		entries = append(entries, strconv.Itoa(q)+"m=0")
	}
	c, errs := PoolConfig(settings.Default(), settings.DefaultCeilings(), map[string]string{ann("pool.prewarm"): strings.Join(entries, ",")}, 0)
	if len(errs) == 0 || len(c.Prewarm) > c.MaxSlots {
		t.Fatalf("prewarm of %d quotas accepted: %d entries kept, errors %v", len(entries), len(c.Prewarm), errs)
	}
	huge := strings.Repeat("x", 100000)
	for _, name := range []string{ann("pool.mode"), ann("admission.budget"), ann("pool.prewarm"), ann("admission.overcommit")} {
		_, errs = PoolConfig(settings.Default(), settings.DefaultCeilings(), map[string]string{name: huge}, 0)
		if len(errs) != 1 || len(errs[0].Error()) > 1000 {
			t.Fatalf("%s: %d errors, message of %d bytes", name, len(errs), len(errs[0].Error()))
		}
	}
	_, errs = PoolConfig(settings.Default(), settings.DefaultCeilings(), map[string]string{ann("pool.prewarm"): strings.Repeat("1=0,", 50000) + "1=0"}, 0)
	if len(errs) != 1 || len(errs[0].Error()) > 1000 {
		t.Fatalf("prewarm of 50001 entries: %v", errs)
	}
}

// TestCPULimit: the limit the kubelet reports applied wins over the spec
// (an in-place resize changes the spec first, the status once applied).
func TestCPULimit(t *testing.T) {
	lim := func(q string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(q)}}
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "fn", Resources: lim("400m")}, {Name: "side"}}}}
	if got := CPULimit(pod, "fn"); got != "400m" {
		t.Fatalf("spec only: %q", got)
	}
	if got := CPULimit(pod, "side"); got != "" {
		t.Fatalf("no limit: %q", got)
	}
	applied := lim("1")
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "fn", Resources: &applied}}
	if got := CPULimit(pod, "fn"); got != "1" {
		t.Fatalf("status says 1, spec 400m: %q, want the applied 1", got)
	}
	pod.Status.ContainerStatuses[0].Resources = &corev1.ResourceRequirements{}
	if got := CPULimit(pod, "fn"); got != "" {
		t.Fatalf("status says none: %q", got)
	}
}

// TestOutsideSlot: a container whose main thread sits in one of its slots
// is served at the container's cgroup, not the slot's (an agent that
// restarted made slots inside a slot that way).
func TestOutsideSlot(t *testing.T) {
	for in, want := range map[string]string{
		"/kubepods.slice/p.slice/cri-containerd-1.scope/cpuslot-1": "/kubepods.slice/p.slice/cri-containerd-1.scope",
		"/kubepods.slice/p.slice/cri-containerd-1.scope":           "/kubepods.slice/p.slice/cri-containerd-1.scope",
		"/kubepods/burstable/pod1/abc/cpuslot-42":                  "/kubepods/burstable/pod1/abc",
		"/kubepods.slice/p.slice/cri-containerd-1.scope/cpuslot-x": "/kubepods.slice/p.slice/cri-containerd-1.scope/cpuslot-x",
	} {
		if got := OutsideSlot(in); got != want {
			t.Errorf("OutsideSlot(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAnnotationCeilings: where tenants write pod annotations they must
// not set the bounds the operator relies on (4096 slots, 100x overcommit,
// the whole quota lent): each value above the operator's ceiling is
// clamped to it and said so.
func TestAnnotationCeilings(t *testing.T) {
	ceil := settings.DefaultCeilings()
	c, errs := PoolConfig(settings.Default(), ceil, map[string]string{ann("pool.maxSlots"): "4096", ann("pool.prewarm"): "250m=4000,1=96",
		ann("admission.overcommit"): "100", ann("admission.lendRatio"): "1", ann("admission.budget"): "64"}, 2000)
	if c.MaxSlots != ceil.MaxSlots || total(c.Prewarm) != ceil.PrewarmSlots || c.Overcommit != ceil.Overcommit ||
		c.LendRatio != ceil.LendRatio || c.BudgetMilli != 2000 {
		t.Errorf("not clamped to the ceilings %+v (budget: the container's CPU limit): %+v", ceil, c)
	}
	var clamped int
	for _, err := range errs {
		var cl *settings.Clamped
		if !errors.As(err, &cl) {
			t.Errorf("not a clamp: %v", err)
			continue
		}
		clamped++
	}
	if clamped != 5 {
		t.Errorf("want 5 clamps said, got %v", errs)
	}
	// Within the ceilings nothing is said; the operator's own defaults are
	// never clamped.
	base := settings.Default()
	base.MaxSlots = 1000
	c, errs = PoolConfig(base, ceil, map[string]string{ann("pool.prewarm"): "500m=2", ann("admission.overcommit"): "1.5"}, 0)
	if len(errs) != 0 || c.MaxSlots != 1000 || c.Overcommit != 1.5 {
		t.Errorf("%v %+v", errs, c)
	}
}

func total(p map[uint32]int) int {
	n := 0
	for _, c := range p {
		n += c
	}
	return n
}
