// Tests of the cpuslot Helm chart: helm lint and helm template (helm from
// hack/helm.sh) with default and all-options-on values; the rendered
// objects against docs/kubernetes-contract.md; the rendered agent
// configuration through the agent's own loader; the values schema; the
// generated files (generate.go: deploy/cpuslot.yaml,
// deploy/prometheus/cpuslot-rules.yml, queries.txt) up to date. The
// queries and dashboards: queries_test.go.
package chart

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/cpuslot/cpuslot/internal/agent"
)

const (
	chartDir = "."
	repoRoot = "../.."
)

var (
	chartOnce sync.Once
	theChart  *Chart
	chartErr  error
)

// helmChart opens the chart once per test binary (hack/helm.sh builds helm
// once per machine, cached in $CPUSLOT_E2E_CACHE/tools, see hack/helm.sh).
func helmChart(t *testing.T) *Chart {
	t.Helper()
	chartOnce.Do(func() { theChart, chartErr = Open(repoRoot) })
	if chartErr != nil {
		t.Fatal(chartErr)
	}
	return theChart
}

func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return helmChart(t).Helm(args...)
}

// render runs helm template and parses every object.
func render(t *testing.T, args ...string) []obj {
	t.Helper()
	objs, err := helmChart(t).render(args...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func one(t *testing.T, objs []obj, kind string) obj {
	t.Helper()
	f := find(objs, kind)
	if len(f) != 1 {
		t.Fatalf("want one %s, got %d", kind, len(f))
	}
	return f[0]
}

// configMap returns the agent's configuration ConfigMap (not a dashboard).
func configMap(t *testing.T, objs []obj) obj {
	t.Helper()
	for _, o := range find(objs, "ConfigMap") {
		if str(o, "data", "config.yaml") != "" {
			return o
		}
	}
	t.Fatal("no ConfigMap with config.yaml")
	return nil
}

func agentContainer(t *testing.T, ds obj) map[string]any {
	t.Helper()
	cs := list(ds, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("want one container in the DaemonSet, got %d", len(cs))
	}
	return cs[0].(map[string]any)
}

func strings_(l []any) []string {
	out := make([]string, len(l))
	for i, v := range l {
		out[i] = fmt.Sprint(v)
	}
	return out
}

func TestLint(t *testing.T) {
	for _, args := range [][]string{nil, {"-f", allOnValues}, {"--set", "containerdMount=socket,metrics.service.enabled=false"}} {
		if out, err := runHelm(t, append([]string{"lint", "--strict", chartDir}, args...)...); err != nil {
			t.Errorf("helm lint %v: %v\n%s", args, err, out)
		}
	}
}

// TestDefaults checks the default rendering against the contract.
func TestDefaults(t *testing.T) {
	objs := render(t)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.kind()]++
		if o.kind() != "ClusterRole" && o.kind() != "ClusterRoleBinding" && str(o, "metadata", "namespace") != manifestNamespace {
			t.Errorf("%s %s: namespace %q, want the release's", o.kind(), o.name(), str(o, "metadata", "namespace"))
		}
	}
	want := map[string]int{"ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "ConfigMap": 3, "DaemonSet": 1, "Service": 1}
	if !reflect.DeepEqual(kinds, want) {
		t.Errorf("objects %v, want %v (no ServiceMonitor or PrometheusRule by default)", kinds, want)
	}

	ds := one(t, objs, "DaemonSet")
	spec := get(ds, "spec", "template", "spec")
	if get(spec, "hostPID") != true {
		t.Error("hostPID is not true")
	}
	if get(spec, "hostNetwork") != nil {
		t.Error("hostNetwork is set by default")
	}
	if got := str(spec, "priorityClassName"); got != "system-node-critical" {
		t.Errorf("priorityClassName %q", got)
	}
	if got := list(spec, "tolerations"); len(got) != 1 || !reflect.DeepEqual(got[0], map[string]any{"operator": "Exists"}) {
		t.Errorf("tolerations %v, want [{operator: Exists}]", got)
	}
	if got := get(ds, "spec", "updateStrategy"); !reflect.DeepEqual(got, map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxUnavailable": float64(1)}}) {
		t.Errorf("updateStrategy %v", got)
	}
	if get(spec, "terminationGracePeriodSeconds") == nil {
		t.Error("no terminationGracePeriodSeconds")
	}
	sa := one(t, objs, "ServiceAccount")
	if str(spec, "serviceAccountName") != sa.name() {
		t.Errorf("serviceAccountName %q, ServiceAccount %q", str(spec, "serviceAccountName"), sa.name())
	}
	if str(ds, "spec", "template", "metadata", "annotations", "checksum/config") == "" {
		t.Error("no checksum/config annotation: config changes would not roll the agents")
	}
	if get(ds, "spec", "template", "metadata", "annotations", "prometheus.io/scrape") != nil {
		t.Error("prometheus.io annotations by default")
	}

	c := agentContainer(t, ds)
	if got := strings_(list(c, "args")); !slices.Equal(got, []string{"run", "--kubernetes", "--config", "/etc/cpuslot/config.yaml"}) {
		t.Errorf("args %q", got)
	}
	if str(c, "image") != "docker.io/cpuslot/node-agent:0.1.0" {
		t.Errorf("image %q, want the appVersion tag", str(c, "image"))
	}
	if sc := get(c, "securityContext"); !reflect.DeepEqual(sc, map[string]any{"privileged": true, "runAsUser": float64(0)}) {
		t.Errorf("securityContext %v, want the default privileged, runAsUser 0", sc)
	}
	env := list(c, "env")
	if len(env) != 1 || str(env[0], "name") != "NODE_NAME" || str(env[0], "valueFrom", "fieldRef", "fieldPath") != "spec.nodeName" {
		t.Errorf("env %v, want only NODE_NAME from spec.nodeName", env)
	}
	if str(c, "livenessProbe", "httpGet", "path") != "/healthz" || str(c, "livenessProbe", "httpGet", "port") != "metrics" ||
		str(c, "readinessProbe", "httpGet", "path") != "/readyz" || str(c, "readinessProbe", "httpGet", "port") != "metrics" {
		t.Errorf("probes %v %v", get(c, "livenessProbe"), get(c, "readinessProbe"))
	}
	if ports := list(c, "ports"); len(ports) != 1 || get(ports[0], "containerPort") != float64(9464) || str(ports[0], "name") != "metrics" {
		t.Errorf("ports %v", ports)
	}
	if get(c, "resources", "limits", "cpu") != nil || get(c, "resources", "requests", "cpu") == nil || get(c, "resources", "limits", "memory") == nil {
		t.Errorf("resources %v: want a CPU request, a memory limit, no CPU limit", get(c, "resources"))
	}

	// Mounts: exactly the contract's host paths, plus the config.
	type mount struct {
		host, path, hostType, propagation string
		readOnly                          bool
	}
	vols := map[string]any{}
	for _, v := range list(spec, "volumes") {
		vols[str(v, "name")] = v
	}
	var mounts []mount
	for _, m := range list(c, "volumeMounts") {
		v := vols[str(m, "name")]
		if v == nil {
			t.Fatalf("mount of an undeclared volume %v", m)
		}
		ro, _ := get(m, "readOnly").(bool)
		if get(v, "configMap") != nil {
			if str(m, "mountPath") != "/etc/cpuslot" || !ro || str(v, "configMap", "name") != configMap(t, objs).name() {
				t.Errorf("config mount %v of %v", m, v)
			}
			continue
		}
		if get(v, "hostPath") == nil {
			t.Errorf("unexpected volume %v", v)
			continue
		}
		mounts = append(mounts, mount{str(v, "hostPath", "path"), str(m, "mountPath"), str(v, "hostPath", "type"), str(m, "mountPropagation"), ro})
	}
	wantMounts := []mount{
		{"/sys/fs/cgroup", "/sys/fs/cgroup", "Directory", "", false},
		{"/run/containerd", "/run/containerd", "Directory", "HostToContainer", true},
		{"/var/run/nri", "/var/run/nri", "DirectoryOrCreate", "", true},
		{"/var/lib/kubelet/pods", "/var/lib/kubelet/pods", "Directory", "HostToContainer", false},
	}
	if !reflect.DeepEqual(mounts, wantMounts) {
		t.Errorf("host mounts\n got %+v\nwant %+v", mounts, wantMounts)
	}
	if len(vols) != len(wantMounts)+1 {
		t.Errorf("volumes %v", vols)
	}

	// RBAC: pods get/list/watch, events create/patch, nothing else.
	role := one(t, objs, "ClusterRole")
	wantRules := []any{
		map[string]any{"apiGroups": []any{""}, "resources": []any{"pods"}, "verbs": []any{"get", "list", "watch"}},
		map[string]any{"apiGroups": []any{""}, "resources": []any{"events"}, "verbs": []any{"create", "patch"}},
	}
	if got := list(role, "rules"); !reflect.DeepEqual(got, wantRules) {
		t.Errorf("ClusterRole rules %v", got)
	}
	binding := one(t, objs, "ClusterRoleBinding")
	if str(binding, "roleRef", "name") != role.name() || str(binding, "subjects", "0", "name") != sa.name() ||
		str(binding, "subjects", "0", "namespace") != manifestNamespace {
		t.Errorf("ClusterRoleBinding %v", binding)
	}

	svc := one(t, objs, "Service")
	if str(svc, "spec", "clusterIP") != "None" || str(svc, "spec", "ports", "0", "targetPort") != "metrics" {
		t.Errorf("Service %v", svc)
	}
	if !reflect.DeepEqual(get(svc, "spec", "selector"), get(ds, "spec", "selector", "matchLabels")) {
		t.Error("Service selector differs from the DaemonSet's")
	}

	// The rendered configuration is what the agent loads; with default
	// values it equals the agent's defaults but for the HTTP address.
	cfg := loadConfig(t, configMap(t, objs))
	wantCfg := agent.DefaultConfig()
	wantCfg.HTTP = "0.0.0.0:9464"
	wantCfg.APIVersion, wantCfg.Kind = agent.ConfigAPIVersion, agent.ConfigKind // the chart renders the versioned form
	if !reflect.DeepEqual(cfg, wantCfg) {
		t.Errorf("rendered config differs from the agent's defaults (chart values and agent defaults drifted apart)\n got %+v\nwant %+v", cfg, wantCfg)
	}
}

// loadConfig feeds the rendered config.yaml to the agent's loader.
func loadConfig(t *testing.T, cm obj) agent.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(str(cm, "data", "config.yaml")), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := agent.LoadConfig(path)
	if err != nil {
		t.Fatalf("agent.LoadConfig: %v", err)
	}
	if _, err := cfg.Settings(); err != nil {
		t.Fatalf("Settings: %v", err)
	}
	return cfg
}

// TestAllOn renders every option turned on (testdata/all-on.yaml).
func TestAllOn(t *testing.T) {
	objs := render(t, "-f", allOnValues)
	for _, k := range []string{"ServiceMonitor", "PrometheusRule"} {
		one(t, objs, k)
	}
	ds := one(t, objs, "DaemonSet")
	c := agentContainer(t, ds)
	args := strings_(list(c, "args"))
	if !slices.Contains(args, "--cleanup-on-exit") || !slices.Contains(args, "--log-level") {
		t.Errorf("args %q: want --cleanup-on-exit and the extra args", args)
	}
	envs := map[string]string{}
	for _, e := range list(c, "env") {
		envs[str(e, "name")] = str(e, "value")
	}
	if envs["KUBERNETES_SERVICE_HOST"] != "10.0.0.1" || envs["KUBERNETES_SERVICE_PORT"] != "6443" {
		t.Errorf("env %v: want the API server override", envs)
	}
	if str(c, "image") != "registry.example/cpuslot/node-agent:dev" || str(c, "imagePullPolicy") != "Never" {
		t.Errorf("image %q %q", str(c, "image"), str(c, "imagePullPolicy"))
	}
	spec := get(ds, "spec", "template", "spec")
	if get(spec, "hostNetwork") != true || str(spec, "dnsPolicy") != "ClusterFirstWithHostNet" {
		t.Error("hostNetwork option not rendered")
	}
	if str(ds, "spec", "template", "metadata", "annotations", "prometheus.io/port") != "9464" {
		t.Error("prometheus.io annotations not rendered")
	}
	// The all-on values change the agent settings: they reach the agent.
	cfg := loadConfig(t, configMap(t, objs))
	pc, _ := cfg.Settings()
	if cfg.Pool.Mode != "cache-lazy" || cfg.Admission.Policy != "degrade" || pc.BudgetMilli != 2000 ||
		pc.Prewarm[250] != 8 || pc.Prewarm[1500] != 1 || cfg.Pool.Period.Milliseconds() != 50 ||
		!slices.Equal(cfg.Kubernetes.Select, []string{"openwhisk", "knative"}) ||
		cfg.Kubernetes.ContainerdSocket != "/run/cpuslot-e2e/containerd/containerd.sock" {
		t.Errorf("rendered config %+v", cfg)
	}
	// The containerd mount follows the socket's path.
	found := false
	for _, v := range list(spec, "volumes") {
		if str(v, "name") == "containerd" {
			found = str(v, "hostPath", "path") == "/run/cpuslot-e2e/containerd"
		}
	}
	if !found {
		t.Errorf("containerd volume does not follow kubernetes.containerdSocket: %v", list(spec, "volumes"))
	}
	if !cfg.DebugPoolsRemote {
		t.Error("metrics.debugPoolsRemote did not reach the agent")
	}
	// The NetworkPolicy admits the given peers to the metrics port of the
	// agent pods, and nothing else.
	np := one(t, objs, "NetworkPolicy")
	if !reflect.DeepEqual(get(np, "spec", "podSelector", "matchLabels"), get(ds, "spec", "selector", "matchLabels")) ||
		!slices.Equal(strings_(list(np, "spec", "policyTypes")), []string{"Ingress"}) ||
		len(list(np, "spec", "ingress")) != 1 ||
		str(np, "spec", "ingress", "0", "from", "0", "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name") != "monitoring" ||
		get(np, "spec", "ingress", "0", "ports", "0", "port") != float64(9464) {
		t.Errorf("NetworkPolicy %v", np)
	}
	// Enabled without peers: no pod may reach the port.
	np = one(t, render(t, "--set", "metrics.networkPolicy.enabled=true"), "NetworkPolicy")
	if in, ok := get(np, "spec", "ingress").([]any); !ok || len(in) != 0 {
		t.Errorf("NetworkPolicy without peers: ingress %v, want [] (deny)", get(np, "spec", "ingress"))
	}
	sm := one(t, objs, "ServiceMonitor")
	if str(sm, "metadata", "labels", "release") != "kube-prometheus-stack" ||
		str(sm, "spec", "endpoints", "0", "relabelings", "0", "replacement") != "cpuslot-node-agent" {
		t.Errorf("ServiceMonitor %v", sm)
	}
	// The agents' per-container series carry namespace, pod and container
	// of their own, which must win over the target's.
	if get(sm, "spec", "endpoints", "0", "honorLabels") != true {
		t.Errorf("ServiceMonitor does not honor the series' labels: %v", get(sm, "spec", "endpoints", "0"))
	}
	rule := one(t, objs, "PrometheusRule")
	alerts := map[string]bool{}
	operating, err := os.ReadFile(filepath.Join(repoRoot, "docs/operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range list(rule, "spec", "groups") {
		for _, r := range list(g, "rules") {
			name := str(r, "alert")
			alerts[name] = true
			if str(r, "for") == "" || str(r, "expr") == "" || str(r, "labels", "severity") == "" {
				t.Errorf("rule %v lacks for, expr or severity", r)
			}
			if name == "CpuslotExtraRule" {
				continue // the user's
			}
			// Every alert has a runbook: its section of docs/operating.md.
			want := "https://github.com/cpuslot/cpuslot/blob/main/docs/operating.md#" + strings.ToLower(name)
			if got := str(r, "annotations", "runbook_url"); got != want {
				t.Errorf("alert %s: runbook_url %q, want %q", name, got, want)
			}
			if !strings.Contains(string(operating), "\n#### "+name+"\n") {
				t.Errorf("alert %s: no runbook section (#### %s) in docs/operating.md", name, name)
			}
		}
	}
	for _, a := range []string{"CpuslotAgentDown", "CpuslotAgentsAbsent", "CpuslotSlotErrors", "CpuslotAdmissionRefused", "CpuslotAcquireLatencyHigh", "CpuslotExtraRule"} {
		if !alerts[a] {
			t.Errorf("alert %s missing (have %v)", a, alerts)
		}
	}
	// The socket-file mount option.
	objs = render(t, "--set", "containerdMount=socket,kubernetes.containerdSocket=/run/k3s/containerd/containerd.sock")
	for _, v := range list(one(t, objs, "DaemonSet"), "spec", "template", "spec", "volumes") {
		if str(v, "name") == "containerd" && (str(v, "hostPath", "path") != "/run/k3s/containerd/containerd.sock" || str(v, "hostPath", "type") != "Socket") {
			t.Errorf("containerdMount=socket: volume %v", v)
		}
	}
	// Toggles off.
	objs = render(t, "--set", "grafana.dashboards.enabled=false,metrics.service.enabled=false,rbac.create=false,serviceAccount.create=false")
	for _, k := range []string{"Service", "ClusterRole", "ClusterRoleBinding", "ServiceAccount"} {
		if len(find(objs, k)) != 0 {
			t.Errorf("%s rendered although disabled", k)
		}
	}
	if n := len(find(objs, "ConfigMap")); n != 1 {
		t.Errorf("%d ConfigMaps with dashboards off, want 1", n)
	}
}

// TestImageDigest: a digest pins the image, repository@digest.
func TestImageDigest(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	c := agentContainer(t, one(t, render(t, "--set", "image.digest="+digest+",image.tag=ignored"), "DaemonSet"))
	if got, want := str(c, "image"), "docker.io/cpuslot/node-agent@"+digest; got != want {
		t.Errorf("image %q, want %q", got, want)
	}
}

// TestSecurityContextValue: the agent's securityContext is the value, so a
// user can extend it.
func TestSecurityContextValue(t *testing.T) {
	c := agentContainer(t, one(t, render(t, "--set", "securityContext.seccompProfile.type=RuntimeDefault"), "DaemonSet"))
	want := map[string]any{"privileged": true, "runAsUser": float64(0), "seccompProfile": map[string]any{"type": "RuntimeDefault"}}
	if sc := get(c, "securityContext"); !reflect.DeepEqual(sc, want) {
		t.Errorf("securityContext %v, want %v", sc, want)
	}
}

// TestSchema: values.schema.json refuses bad values with a message naming
// the field, and accepts quantities given as numbers.
func TestSchema(t *testing.T) {
	bad := map[string]string{
		"pool.mode=bogus":                 "pool.mode",
		"pool.limit=hard":                 "pool.limit",
		"admission.policy=drop":           "admission.policy",
		"pool.prewarm=250m:4":             "pool.prewarm",
		"pool.prewarm=250m=4;1=2":         "pool.prewarm",
		"pool.period=100":                 "pool.period",
		"pool.idleTimeout=2 minutes":      "pool.idleTimeout",
		"pool.maxSlots=0":                 "pool.maxSlots",
		"pool.maxActions=0":               "pool.maxActions",
		"pool.maxQuota=lots":              "pool.maxQuota",
		"maxContainers=0":                 "maxContainers",
		"admission.budget=two":            "admission.budget",
		"admission.minDegraded=-5m":       "admission.minDegraded",
		"admission.overcommit=0":          "admission.overcommit",
		"admission.overcommit=101":        "admission.overcommit",
		"admission.lendRatio=2":           "admission.lendRatio",
		"admission.lendRatio=-0.5":        "admission.lendRatio",
		"pool.maxSlots=5000":              "pool.maxSlots",
		"kubernetes.select={openwhisk,x}": "kubernetes.select",
		"logLevel=trace":                  "logLevel",
		"containerdMount=file":            "containerdMount",
		"image.pullPolicy=Sometimes":      "image.pullPolicy",
		"image.digest=latest":             "image.digest",
		"prometheusRule.slotErrors.for=5": "prometheusRule.slotErrors.for",
		"typo=1":                          "typo",
	}
	for set, field := range bad {
		out, err := runHelm(t, "template", "x", chartDir, "--set", set)
		if err == nil {
			t.Errorf("--set %s: rendered, want a schema error", set)
		} else if !strings.Contains(out, "schema") || !strings.Contains(out, field) {
			t.Errorf("--set %s: error does not name %s:\n%s", set, field, out)
		}
	}
	objs := render(t, "--set", "admission.budget=2,admission.minDegraded=0.1,pool.prewarm=0.5=2\\,1500m=1,pool.mode=uncached")
	cfg := loadConfig(t, configMap(t, objs))
	pc, _ := cfg.Settings()
	if pc.BudgetMilli != 2000 || pc.MinDegradedMilli != 100 || pc.Prewarm[500] != 2 || pc.Prewarm[1500] != 1 {
		t.Errorf("quantities given as numbers: %+v", pc)
	}
}

// checkGenerated compares a committed generated file (path relative to the
// repository's root) with what the generator makes now.
func checkGenerated(t *testing.T, path, want string) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatalf("%v (run make manifests)", err)
	}
	if string(got) != want {
		t.Errorf("%s is out of date: run make manifests", path)
	}
}

// TestManifests: deploy/cpuslot.yaml holds the Namespace and the agent's
// DaemonSet; promtool accepts deploy/prometheus/cpuslot-rules.yml.
func TestManifests(t *testing.T) {
	c := helmChart(t)
	want, err := c.manifests()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parseObjects(want)
	if err != nil {
		t.Fatal(err)
	}
	if one(t, objs, "Namespace").name() != manifestNamespace || len(find(objs, "DaemonSet")) != 1 {
		t.Fatal("rendered manifests lack the Namespace or the DaemonSet")
	}

	// The committed rule file (TestGenerate: up to date) is valid.
	rulesPath := filepath.Join(repoRoot, RulesFile)
	if promtool, err := exec.LookPath("promtool"); err == nil {
		if out, err := exec.Command(promtool, "check", "rules", rulesPath).CombinedOutput(); err != nil {
			t.Errorf("promtool check rules %s: %v\n%s", rulesPath, err, out)
		}
	}
}

// TestGenerate: the committed generated files are what `make manifests`
// makes now.
func TestGenerate(t *testing.T) {
	files, err := helmChart(t).Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 {
		t.Errorf("generated %d files, want 3", len(files))
	}
	for path, want := range files {
		checkGenerated(t, path, want)
	}
}

// TestReadmeValues: every value in values.yaml is in README.md's table.
func TestReadmeValues(t *testing.T) {
	b, err := os.ReadFile("values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(readme)
	// maps documented as a whole
	whole := map[string]bool{"resources": true, "nodeSelector": true, "updateStrategy": true,
		"livenessProbe": true, "readinessProbe": true, "grafana.dashboards.labels": true, "securityContext": true}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			key := prefix + k
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 && !whole[key] {
				walk(key+".", sub)
				continue
			}
			parent, leaf := "", key
			if i := strings.LastIndex(key, "."); i >= 0 {
				parent, leaf = key[:i], key[i+1:]
			}
			if !strings.Contains(doc, "`"+key+"`") &&
				!(parent != "" && strings.Contains(doc, "`"+parent+".") && strings.Contains(doc, "`."+leaf+"`")) {
				t.Errorf("README.md does not document %s", key)
			}
		}
	}
	walk("", values)
}
