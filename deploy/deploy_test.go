// Tests of the recipes in deploy/: the OpenWhisk action pod the invoker
// builds from our pod template (simulated by generate.go, written to
// openwhisk/action-pod.example.yaml), the runtime manifest, the helm
// post-renderer (with kubectl; against the real openwhisk-deploy-kube chart
// when OPENWHISK_CHART names its helm/openwhisk directory), the Knative
// Services, and the Prometheus configuration. Pods are checked with the
// agent's own selection code.
package deploy

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	k8sdiscover "github.com/cpuslot/cpuslot/internal/discover/kubernetes"
	"github.com/cpuslot/cpuslot/internal/pool"
)

const (
	socketDir  = "/run/cpuslot"
	socketPath = "/run/cpuslot/agent.sock"
	volume     = "cpuslot" // the chart's kubernetes.socketVolume default
)

func mustReadYAML(t *testing.T, path string, into any) {
	t.Helper()
	if err := readYAML(path, into); err != nil {
		t.Fatal(err)
	}
}

func selector(t *testing.T) k8sdiscover.Selector {
	s, err := k8sdiscover.ParseSelector([]string{"openwhisk", "knative", "annotated"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkServed applies the contract's "What a served pod declares" and the
// agent's own selection to a pod.
func checkServed(t *testing.T, pod *corev1.Pod, wantContainer string) *corev1.Container {
	t.Helper()
	name, why := selector(t).ServedContainer(pod)
	if name != wantContainer {
		t.Fatalf("the agent serves container %q (%s), want %q", name, why, wantContainer)
	}
	if !k8sdiscover.HasVolume(pod, volume) {
		t.Errorf("pod lacks the emptyDir volume %q", volume)
	}
	var c *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			c = &pod.Spec.Containers[i]
		}
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || m.Name == volume && m.MountPath == socketDir
	}
	if !mounted {
		t.Errorf("container %s does not mount %q at %s: %v", name, volume, socketDir, c.VolumeMounts)
	}
	env := envMap(c)
	if env["CPUSLOT_SOCKET"] != socketPath {
		t.Errorf("container %s: CPUSLOT_SOCKET %q, want %s", name, env["CPUSLOT_SOCKET"], socketPath)
	}
	return c
}

func envMap(c *corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

// ---------------------------------------------------------------- OpenWhisk

func TestOpenWhiskActionPod(t *testing.T) {
	pod, err := owActionPod(".")
	if err != nil {
		t.Fatal(err)
	}
	c := checkServed(t, pod, "user-action")
	if q := c.Resources.Limits.Cpu(); q.IsZero() {
		t.Error("action pods get no CPU limit (cpu-scaling): no admission budget")
	}
	if pod.Annotations["prometheus.io/port"] != "9102" {
		t.Error("action pods are not annotated for scraping the runtime on 9102")
	}
}

// TestGenerate: the committed generated files are what `make manifests`
// makes now.
func TestGenerate(t *testing.T) {
	files, err := Generate("..")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range files {
		got, err := os.ReadFile(filepath.Join("..", path))
		if err != nil || string(got) != want {
			t.Errorf("%s is out of date (%v): run make manifests", path, err)
		}
	}
}

func TestOpenWhiskRuntimes(t *testing.T) {
	b, err := os.ReadFile("openwhisk/kustomize/runtimes.json")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Runtimes map[string][]struct {
			Kind    string `json:"kind"`
			Default bool   `json:"default"`
			Image   struct {
				Prefix, Name, Tag string
			} `json:"image"`
			Deprecated bool `json:"deprecated"`
			Attached   *struct {
				AttachmentName, AttachmentType string
			} `json:"attached"`
			RequireMain bool `json:"requireMain"`
		} `json:"runtimes"`
		Blackboxes []any `json:"blackboxes"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	ours := map[string]bool{}
	deprecated := map[string]bool{}
	for family, kinds := range m.Runtimes {
		defaults := 0
		for _, k := range kinds {
			if !strings.HasPrefix(k.Kind, family+":") {
				t.Errorf("kind %s in family %s", k.Kind, family)
			}
			if k.Default {
				defaults++
			}
			if k.Deprecated {
				deprecated[k.Kind] = true
			}
			// Pinned: a release's tag, never a moving one (OpenWhisk names
			// images by tag only).
			if k.Image.Tag == "" || k.Image.Tag == "latest" || k.Image.Tag == "nightly" || k.Image.Tag == "dev" {
				t.Errorf("%s: image %+v not pinned to a release", k.Kind, k.Image)
			}
			if strings.HasSuffix(k.Kind, ":cpuslot") {
				ours[k.Kind] = true
				if k.Image.Prefix != "cpuslot" || k.Image.Name != "runtime-jvm" || k.Attached == nil {
					t.Errorf("%s: image %+v attached %+v", k.Kind, k.Image, k.Attached)
				}
			}
		}
		if defaults != 1 {
			t.Errorf("family %s has %d default kinds, want 1", family, defaults)
		}
	}
	// GraalJS is not Node.js (no require, fs or npm): its kind has a family
	// of its own; the old nodejs:cpuslot stays, deprecated, so that actions
	// created with it still run (OpenWhisk refuses new ones) for one release.
	for _, k := range []string{"java:cpuslot", "javascript:cpuslot", "python:cpuslot", "nodejs:cpuslot"} {
		if !ours[k] {
			t.Errorf("no kind %s", k)
		}
	}
	if !deprecated["nodejs:cpuslot"] || deprecated["javascript:cpuslot"] || len(m.Runtimes["javascript"]) != 1 || !m.Runtimes["javascript"][0].Default {
		t.Errorf("want javascript:cpuslot the javascript family's one kind and nodejs:cpuslot deprecated: %+v", m.Runtimes["javascript"])
	}
	// The stock kinds are those of OpenWhisk's own manifest today.
	for _, k := range []string{"nodejs:20", "nodejs:18", "python:3.11", "python:3.10"} {
		found := false
		for _, kk := range m.Runtimes[k[:strings.Index(k, ":")]] {
			found = found || kk.Kind == k
		}
		if !found {
			t.Errorf("no stock kind %s", k)
		}
	}
	if j := m.Runtimes["java"]; len(j) == 0 || !j[0].RequireMain || j[0].Attached.AttachmentName != "jarfile" {
		t.Errorf("java:cpuslot must take a jar and require --main: %+v", j)
	}
	if len(m.Blackboxes) == 0 {
		t.Error("no blackboxes")
	}
}

// A minimal stand-in for the openwhisk-deploy-kube chart's invoker and
// controller StatefulSets.
const fakeOpenWhisk = `apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: rel-invoker
spec:
  selector: {matchLabels: {name: rel-invoker}}
  serviceName: rel-invoker
  template:
    metadata: {labels: {name: rel-invoker}}
    spec:
      containers:
      - name: invoker
        image: openwhisk/invoker:x
        env:
        - name: CONFIG_whisk_containerFactory_containerArgs_extraEnvVars_0
          value: "__OW_ALLOW_CONCURRENT=true"
        - name: RUNTIMES_MANIFEST
          value: "{}"
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: rel-controller
spec:
  selector: {matchLabels: {name: rel-controller}}
  serviceName: rel-controller
  template:
    metadata: {labels: {name: rel-controller}}
    spec:
      containers:
      - name: controller
        image: openwhisk/controller:x
        env:
        - name: RUNTIMES_MANIFEST
          value: "{}"
`

type object struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Template corev1.PodTemplateSpec `json:"template"`
	} `json:"spec"`
	Data map[string]string `json:"data"`
}

func postRender(t *testing.T, in string) []object {
	t.Helper()
	cmd := exec.Command("bash", "openwhisk/post-render.sh")
	cmd.Stdin = strings.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("post-render.sh: %v\n%s", err, stderr.String())
	}
	var objs []object
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(out), -1) {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("post-render output: %v", err)
		}
		if o.Kind != "" {
			objs = append(objs, o)
		}
	}
	return objs
}

// checkPostRendered checks the invoker and controller after post-render.sh.
func checkPostRendered(t *testing.T, objs []object, release string) {
	t.Helper()
	var cm *object
	sts := map[string]*corev1.Container{}
	vols := map[string][]corev1.Volume{}
	for i := range objs {
		o := &objs[i]
		switch o.Kind {
		case "ConfigMap":
			if strings.HasPrefix(o.Metadata.Name, "cpuslot-openwhisk-") {
				cm = o
			}
		case "StatefulSet":
			for j := range o.Spec.Template.Spec.Containers {
				c := &o.Spec.Template.Spec.Containers[j]
				sts[o.Metadata.Name+"/"+c.Name] = c
			}
			vols[o.Metadata.Name] = o.Spec.Template.Spec.Volumes
		}
	}
	if cm == nil || cm.Data["pod-template.yaml"] == "" || cm.Data["runtimes.json"] == "" {
		t.Fatalf("no generated ConfigMap cpuslot-openwhisk-<hash> with pod-template.yaml and runtimes.json")
	}
	for _, c := range []string{release + "-invoker/invoker", release + "-controller/controller"} {
		if sts[c] == nil {
			t.Fatalf("no container %s", c)
		}
		found := false
		for _, e := range sts[c].Env {
			if e.Name == "RUNTIMES_MANIFEST" {
				found = e.Value == "" && e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil &&
					e.ValueFrom.ConfigMapKeyRef.Name == cm.Metadata.Name && e.ValueFrom.ConfigMapKeyRef.Key == "runtimes.json"
			}
		}
		if !found {
			t.Errorf("%s: RUNTIMES_MANIFEST is not taken from %s: %v", c, cm.Metadata.Name, sts[c].Env)
		}
	}
	inv := sts[release+"-invoker/invoker"]
	env := envMap(inv)
	if env["CONFIG_whisk_kubernetes_podTemplate"] != "file:/cpuslot-openwhisk/pod-template.yaml" ||
		env["CONFIG_whisk_containerFactory_containerArgs_extraEnvVars_1"] != "CPUSLOT_SOCKET="+socketPath ||
		env["CONFIG_whisk_containerFactory_containerArgs_extraEnvVars_3"] != "CPUSLOT_CONTROL_ENDPOINTS=false" ||
		!strings.HasPrefix(env["CONFIG_whisk_containerFactory_containerArgs_extraEnvVars_0"], "__OW_ALLOW_CONCURRENT=") {
		t.Errorf("invoker env %v", env)
	}
	mounted := false
	for _, m := range inv.VolumeMounts {
		mounted = mounted || m.MountPath == "/cpuslot-openwhisk"
	}
	var cmVol bool
	for _, v := range vols[release+"-invoker"] {
		cmVol = cmVol || v.ConfigMap != nil && v.ConfigMap.Name == cm.Metadata.Name
	}
	if !mounted || !cmVol {
		t.Errorf("invoker does not mount %s at /cpuslot-openwhisk", cm.Metadata.Name)
	}
}

func TestOpenWhiskPostRender(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl (kustomize) not installed")
	}
	checkPostRendered(t, postRender(t, fakeOpenWhisk), "rel")
}

// TestOpenWhiskChart renders the real openwhisk-deploy-kube chart with
// mycluster.yaml through the post-renderer. OPENWHISK_CHART: the chart's
// helm/openwhisk directory (a clone of apache/openwhisk-deploy-kube).
func TestOpenWhiskChart(t *testing.T) {
	dir := os.Getenv("OPENWHISK_CHART")
	if dir == "" {
		t.Skip("OPENWHISK_CHART not set")
	}
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl (kustomize) not installed")
	}
	helm, err := exec.Command("bash", "../hack/helm.sh").Output()
	if err != nil {
		t.Fatalf("hack/helm.sh: %v", err)
	}
	post, _ := filepath.Abs("openwhisk/post-render.sh")
	out, err := exec.Command(strings.TrimSpace(string(helm)), "template", "owdev", dir, "-n", "openwhisk",
		"-f", "openwhisk/mycluster.yaml", "--post-renderer", post).CombinedOutput()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	// Parse our way (helm has already run the post-renderer).
	var objs []object
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(out), -1) {
		var o object
		if yaml.Unmarshal([]byte(doc), &o) == nil && o.Kind != "" {
			objs = append(objs, o)
		}
	}
	checkPostRendered(t, objs, "owdev")
	for _, o := range objs {
		for _, c := range o.Spec.Template.Spec.Containers {
			env := envMap(&c)
			if o.Metadata.Name == "owdev-invoker" && (env["CONFIG_whisk_concurrencyLimit_max"] != "32" ||
				env["CONFIG_whisk_containerFactory_containerArgs_extraEnvVars_0"] != "__OW_ALLOW_CONCURRENT=true") {
				t.Errorf("mycluster.yaml not applied to the invoker: %v", env)
			}
		}
	}
}

// ---------------------------------------------------------------- Knative

type knService struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Template struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec struct {
				ContainerConcurrency int `json:"containerConcurrency"`
				corev1.PodSpec       `json:",inline"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

// knativePod is the pod Knative makes of a Service's template: revision
// labels, the template's annotations, user-container (the first container,
// renamed), queue-proxy.
func knativePod(s *knService) *corev1.Pod {
	tpl := s.Spec.Template
	pod := &corev1.Pod{}
	pod.Name = s.Metadata.Name + "-00001-deployment-7d4b9-x2x"
	pod.Labels = map[string]string{
		"serving.knative.dev/revision": s.Metadata.Name + "-00001", "serving.knative.dev/service": s.Metadata.Name,
		"serving.knative.dev/configuration": s.Metadata.Name, "app": s.Metadata.Name + "-00001",
	}
	pod.Annotations = tpl.Metadata.Annotations
	pod.Spec = *tpl.Spec.PodSpec.DeepCopy()
	pod.Spec.Containers[0].Name = "user-container"
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "queue-proxy", Image: "gcr.io/knative-releases/queue"})
	return pod
}

func TestKnative(t *testing.T) {
	for _, f := range []string{"knative/service.yaml", "knative/service-plain-env.yaml"} {
		t.Run(filepath.Base(f), func(t *testing.T) {
			var s knService
			mustReadYAML(t, f, &s)
			if s.Kind != "Service" || s.APIVersion != "serving.knative.dev/v1" || len(s.Spec.Template.Spec.Containers) != 1 {
				t.Fatalf("not a one-container Knative Service: %+v", s)
			}
			pod := knativePod(&s)
			c := checkServed(t, pod, "user-container")
			// queue-proxy runs the runtime's readiness probe: no traffic before
			// the agent serves the pod (runtime-image/README.md, "Ready once served")
			if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/ready" || p.HTTPGet.Port.IntVal != 0 {
				t.Errorf("user-container: want readinessProbe httpGet /ready on the container's port, got %+v", p)
			}
			// the quota the runtime gets, and that it fits the pod
			var quota string
			for _, e := range c.Env {
				if e.Name != "CPUSLOT_DEFAULT_QUOTA" {
					continue
				}
				quota = e.Value
				if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
					m := regexp.MustCompile(`^metadata\.annotations\['([^']+)'\]$`).FindStringSubmatch(e.ValueFrom.FieldRef.FieldPath)
					if m == nil {
						t.Fatalf("fieldRef %s", e.ValueFrom.FieldRef.FieldPath)
					}
					quota = pod.Annotations[m[1]]
				}
			}
			milli, err := pool.ParseQuota(quota)
			if err != nil {
				t.Fatalf("CPUSLOT_DEFAULT_QUOTA %q: %v", quota, err)
			}
			limit := c.Resources.Limits.Cpu().MilliValue()
			if limit == 0 || int64(milli) > limit {
				t.Errorf("quota %dm does not fit the CPU limit %dm", milli, limit)
			}
			if cc := s.Spec.Template.Spec.ContainerConcurrency; cc > 0 && int64(cc)*int64(milli) > limit {
				t.Errorf("containerConcurrency %d x %dm exceeds the budget (CPU limit %dm)", cc, milli, limit)
			}
			// One slot per concurrent request, and the autoscaler's target in
			// step: requests per pod (concurrency, not rps: a slot bounds
			// concurrency) up to containerConcurrency, scaling out at 70%.
			cc := s.Spec.Template.Spec.ContainerConcurrency
			prewarm, err := pool.ParsePrewarm(pod.Annotations["cpuslot.dev/prewarm"])
			if err != nil {
				t.Errorf("cpuslot.dev/prewarm: %v", err)
			}
			if cc < 1 || len(prewarm) != 1 || prewarm[milli] != cc {
				t.Errorf("cpuslot.dev/prewarm %q: want %d slots of the quota %dm, one per containerConcurrency", pod.Annotations["cpuslot.dev/prewarm"], cc, milli)
			}
			for k, want := range map[string]string{
				"autoscaling.knative.dev/metric": "concurrency", "autoscaling.knative.dev/target": strconv.Itoa(cc),
				"autoscaling.knative.dev/target-utilization-percentage": "70",
			} {
				if got := pod.Annotations[k]; got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
			// What a user copies names a release, never the moving :dev.
			if img := c.Image; !strings.HasPrefix(img, "docker.io/cpuslot/runtime-jvm:") || strings.HasSuffix(img, ":dev") || strings.HasSuffix(img, ":latest") {
				t.Errorf("image %s: want docker.io/cpuslot/runtime-jvm at a release", img)
			}
			// queue-proxy forwards any path: the control endpoints, which
			// Knative never uses, closed to what a function sends through it
			if on := envMap(c)["CPUSLOT_CONTROL_ENDPOINTS"]; on != "false" {
				t.Errorf("CPUSLOT_CONTROL_ENDPOINTS %q, want \"false\"", on)
			}
			for _, v := range pod.Spec.Volumes {
				if v.HostPath != nil {
					t.Error("hostPath volume: needs a Knative feature flag")
				}
			}
		})
	}
}

// ---------------------------------------------------------------- Prometheus

func TestPrometheus(t *testing.T) {
	var values struct {
		Metrics        struct{ Job string }
		RuntimeMetrics struct{ Job string } `json:"runtimeMetrics"`
	}
	b, err := os.ReadFile("../charts/cpuslot/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"prometheus/prometheus.yml", "prometheus/prometheus-file-sd.yml"} {
		var cfg struct {
			ScrapeConfigs []struct {
				JobName     string `json:"job_name"`
				HonorLabels bool   `json:"honor_labels"`
			} `json:"scrape_configs"`
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &cfg); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var jobs []string
		for _, s := range cfg.ScrapeConfigs {
			jobs = append(jobs, s.JobName)
			// The agents' per-container series carry namespace, pod and
			// container of their own, which must win over the targets'.
			if s.JobName == values.Metrics.Job && !s.HonorLabels {
				t.Errorf("%s: job %s does not honor the series' labels", f, s.JobName)
			}
		}
		if want := []string{values.Metrics.Job, values.RuntimeMetrics.Job}; !reflect.DeepEqual(jobs, want) {
			t.Errorf("%s: jobs %v, want the chart's %v", f, jobs, want)
		}
	}
	// Debian's promtool has no Kubernetes discovery: it can check the
	// file_sd variant only.
	if promtool, err := exec.LookPath("promtool"); err == nil {
		if out, err := exec.Command(promtool, "check", "config", "prometheus/prometheus-file-sd.yml").CombinedOutput(); err != nil {
			t.Errorf("promtool check config: %v\n%s", err, out)
		}
	}
}
