package e2e

// Knative Serving in the e2e cluster: its components built from the Go
// module proxy by hack/knative.sh, its manifests read from the module cache
// and applied with the few changes this cluster needs (below). Nothing of
// Knative's is copied into this repository.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// knativeDist is what hack/knative.sh prints: the version, where its
// module's manifests are, and the component images.
type knativeDist struct {
	Version       string
	ServingDir    string
	NetworkingDir string
	CachingDir    string
	ImagesDir     string
}

var (
	knativeOnce sync.Once
	knativeD    knativeDist
	knativeErr  error
)

// knativeBuild runs hack/knative.sh (cached: instant after the first build).
func knativeBuild() (knativeDist, error) {
	knativeOnce.Do(func() {
		repo, err := cluster.FindRepo(".")
		if err != nil {
			knativeErr = err
			return
		}
		cmd := exec.Command("bash", filepath.Join(repo, "hack", "knative.sh"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			knativeErr = fmt.Errorf("hack/knative.sh: %v: %s", err, strings.TrimSpace(stderr.String()))
			return
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), "=")
			switch k {
			case "KNATIVE_VERSION":
				knativeD.Version = v
			case "KNATIVE_SERVING_DIR":
				knativeD.ServingDir = v
			case "KNATIVE_NETWORKING_DIR":
				knativeD.NetworkingDir = v
			case "KNATIVE_CACHING_DIR":
				knativeD.CachingDir = v
			case "KNATIVE_IMAGES":
				knativeD.ImagesDir = v
			}
		}
		if knativeD.Version == "" || knativeD.ServingDir == "" || knativeD.NetworkingDir == "" || knativeD.CachingDir == "" || knativeD.ImagesDir == "" {
			knativeErr = fmt.Errorf("hack/knative.sh printed no KNATIVE_* lines: %s", out)
		}
	})
	return knativeD, knativeErr
}

// e2eImages is every image the package's cluster imports: make images'
// tarballs and Knative's.
func e2eImages() ([]string, error) {
	repo, err := cluster.FindRepo(".")
	if err != nil {
		return nil, err
	}
	ours, _ := filepath.Glob(filepath.Join(repo, "bin", "images", "*.tar"))
	d, err := knativeBuild()
	if err != nil {
		return nil, err
	}
	kn, _ := filepath.Glob(filepath.Join(d.ImagesDir, "*.tar"))
	if len(kn) != len(knativeComponents) {
		return nil, fmt.Errorf("%s: %d image tarballs, want %d (%v)", d.ImagesDir, len(kn), len(knativeComponents), knativeComponents)
	}
	return append(ours, kn...), nil
}

var knativeComponents = []string{"activator", "autoscaler", "controller", "queue", "webhook"}

// The ClusterIP the autoscaler's Service gets. This cluster runs no DNS
// server, and the activator reaches the autoscaler by name
// (autoscaler.knative-serving.svc.cluster.local): the activator pod gets a
// hostAliases entry for it. From the low band the API server keeps for
// static addresses.
const knativeAutoscalerIP = "10.97.0.10"

// Requests of the Knative components: the upstream ones (activator 300m)
// do not fit on a 2-core node beside the runtime pods; limits stay.
var knativeRequests = map[string]any{"cpu": "20m", "memory": "40Mi"}

// knativeManifests renders Knative Serving's release from the module
// sources: the CRDs of knative.dev/networking and knative.dev/caching
// (serving's release bundles them), config-network, then serving's
// config/core. Changes:
//   - ko:// image references -> the imported images;
//   - every component: small requests;
//   - the activator: a hostAliases entry for the autoscaler (no DNS);
//   - config-deployment: docker.io (index.docker.io, as Knative names it)
//     among the registries whose tags are not
//     resolved to digests (there is no registry to ask);
//   - config-autoscaler: stable-window 6s (default 60s) and
//     scale-to-zero-grace-period 6s (default 30s): an idle revision goes to
//     zero in seconds instead of minutes; target-burst-capacity -1: the
//     activator stays in the path (requests enter there anyway), so the
//     autoscaler does not probe the revision's Service by its DNS name
//     before scaling to zero (no DNS here);
//   - left out: the HPAs, the cert-manager Certificate, the caching Image
//     of the queue-proxy (nothing here acts on it).
//
// The webhook configurations are returned apart: they are applied once the
// webhook runs (they fail closed).
func knativeManifests(d knativeDist) (core, webhooks string, err error) {
	var files []string
	for _, f := range []string{"certificate.yaml", "domain-claim.yaml", "ingress.yaml", "serverlessservice.yaml", "config-network.yaml"} {
		files = append(files, filepath.Join(d.NetworkingDir, "config", f))
	}
	files = append(files, filepath.Join(d.CachingDir, "config", "image.yaml"))
	err = filepath.WalkDir(filepath.Join(d.ServingDir, "config", "core"), func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !e.IsDir() && strings.HasSuffix(p, ".yaml") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return "", "", err
	}
	rank := map[string]int{"Namespace": 0, "CustomResourceDefinition": 1, "ServiceAccount": 2, "ClusterRole": 3,
		"ClusterRoleBinding": 4, "Role": 5, "RoleBinding": 6, "ConfigMap": 7, "Secret": 8, "Service": 9,
		"PodDisruptionBudget": 10, "Deployment": 11,
		"ValidatingWebhookConfiguration": 20, "MutatingWebhookConfiguration": 20}
	type doc struct {
		rank int
		obj  map[string]any
	}
	var docs []doc
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", "", err
		}
		s := string(b)
		for _, c := range knativeComponents {
			s = strings.ReplaceAll(s, "ko://knative.dev/serving/cmd/"+c, fmt.Sprintf("docker.io/cpuslot/knative-%s:%s", c, d.Version))
		}
		if strings.Contains(s, "ko://") {
			return "", "", fmt.Errorf("%s: a ko:// reference not among %v", f, knativeComponents)
		}
		for _, part := range strings.Split("\n"+s, "\n---") {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(part), &obj); err != nil {
				return "", "", fmt.Errorf("%s: %v", f, err)
			}
			kind, _ := obj["kind"].(string)
			r, ok := rank[kind]
			if !ok {
				continue
			}
			if err := knativeAdjust(kind, obj); err != nil {
				return "", "", fmt.Errorf("%s: %v", f, err)
			}
			docs = append(docs, doc{r, obj})
		}
	}
	sort.SliceStable(docs, func(i, j int) bool { return docs[i].rank < docs[j].rank })
	var coreB, hookB strings.Builder
	for _, d := range docs {
		b, err := yaml.Marshal(d.obj)
		if err != nil {
			return "", "", err
		}
		w := &coreB
		if d.rank >= 20 {
			w = &hookB
		}
		w.WriteString("---\n")
		w.Write(b)
	}
	return coreB.String(), hookB.String(), nil
}

func knativeAdjust(kind string, obj map[string]any) error {
	meta, _ := obj["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	switch kind {
	case "ConfigMap":
		data, _ := obj["data"].(map[string]any)
		if data == nil {
			data = map[string]any{}
			obj["data"] = data
		}
		switch name {
		case "config-deployment":
			data["registries-skipping-tag-resolving"] = "kind.local,ko.local,dev.local,docker.io,index.docker.io"
		case "config-autoscaler":
			data["stable-window"] = "6s"
			data["scale-to-zero-grace-period"] = "6s"
			data["target-burst-capacity"] = "-1"
		}
	case "Service":
		if name == "autoscaler" {
			spec, _ := obj["spec"].(map[string]any)
			if spec == nil {
				return errors.New("autoscaler Service without spec")
			}
			spec["clusterIP"] = knativeAutoscalerIP
		}
	case "Deployment":
		spec, _ := obj["spec"].(map[string]any)
		tmpl, _ := spec["template"].(map[string]any)
		pspec, _ := tmpl["spec"].(map[string]any)
		ctrs, _ := pspec["containers"].([]any)
		if len(ctrs) == 0 {
			return fmt.Errorf("deployment %s: no containers", name)
		}
		for _, c := range ctrs {
			ctr := c.(map[string]any)
			res, _ := ctr["resources"].(map[string]any)
			if res == nil {
				res = map[string]any{}
				ctr["resources"] = res
			}
			res["requests"] = knativeRequests
		}
		if name == "activator" {
			pspec["hostAliases"] = []any{map[string]any{"ip": knativeAutoscalerIP, "hostnames": []any{
				"autoscaler.knative-serving.svc.cluster.local", "autoscaler.knative-serving.svc", "autoscaler.knative-serving"}}}
		}
	}
	return nil
}

// knativeServing is an installed Knative Serving.
type knativeServing struct {
	dist        knativeDist
	installTime time.Duration
	activator   string // http://<activator-service ClusterIP>:80
}

// installKnative applies Knative Serving, waits until its four deployments
// are Available and its webhook admits, and removes it when the test ends.
func installKnative(t *testing.T, c *cluster.Cluster) *knativeServing {
	t.Helper()
	d, err := knativeBuild()
	if err != nil {
		t.Fatal(err)
	}
	core, hooks, err := knativeManifests(d)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	t.Cleanup(func() { uninstallKnative(t, c, core, hooks) })
	if out, err := c.Apply(ctx, core); err != nil {
		t.Fatalf("applying Knative Serving %s: %v\n%s", d.Version, err, out)
	}
	const ns = "knative-serving"
	for _, dep := range []string{"controller", "webhook", "activator", "autoscaler"} {
		if out, err := c.Kubectl(ctx, "-n", ns, "rollout", "status", "deployment/"+dep, "--timeout=180s"); err != nil {
			desc, _ := c.Kubectl(ctx, "-n", ns, "describe", "pods")
			logs, _ := c.Kubectl(ctx, "-n", ns, "logs", "deployment/"+dep, "--all-containers", "--tail=30")
			t.Fatalf("Knative %s not Available: %v: %s\n--- its logs:\n%s\n--- pods:\n%s", dep, err, out, logs, desc)
		}
	}
	if out, err := c.Apply(ctx, hooks); err != nil {
		t.Fatalf("applying Knative's webhook configurations: %v\n%s", err, out)
	}
	// The webhook fills in its CA bundle (it makes its own certificates).
	if err := pollFor(ctx, 60*time.Second, func() (bool, string) {
		out, err := c.Kubectl(ctx, "get", "validatingwebhookconfiguration", "validation.webhook.serving.knative.dev",
			"-o", "jsonpath={.webhooks[0].clientConfig.caBundle}")
		return err == nil && out != "", fmt.Sprintf("no CA bundle in validation.webhook.serving.knative.dev yet (%v)", err)
	}); err != nil {
		logs, _ := c.Kubectl(ctx, "-n", ns, "logs", "deployment/webhook", "--tail=30")
		t.Fatalf("%v\n--- webhook logs:\n%s", err, logs)
	}
	k := &knativeServing{dist: d, installTime: time.Since(t0)}
	ip, err := c.Kubectl(ctx, "-n", ns, "get", "service", "activator-service", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil || ip == "" {
		t.Fatalf("activator-service ClusterIP: %v %q", err, ip)
	}
	k.activator = "http://" + ip + ":80"
	return k
}

// knDeleteServices deletes every Knative Service and the revision pods
// without their grace period (Knative gives them the revision's timeout,
// 300 s, to drain).
func knDeleteServices(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	if out, err := c.Kubectl(ctx, "delete", "ksvc", "--all", "--all-namespaces", "--wait=true", "--timeout=60s"); err != nil {
		t.Errorf("deleting Knative Services: %v: %s", err, out)
	}
	c.Kubectl(ctx, "delete", "pods", "--all-namespaces", "-l", "serving.knative.dev/revision", "--grace-period=1", "--wait=true", "--timeout=60s")
}

// uninstallKnative removes Knative Serving, its pods without their grace
// period (the activator's is 600 s), so that later tests have the node's
// CPU to themselves.
func uninstallKnative(t *testing.T, c *cluster.Cluster, core, hooks string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Services first, while the controller and webhook still run.
	knDeleteServices(ctx, t, c)
	if out, err := c.KubectlStdin(ctx, hooks, "delete", "--ignore-not-found", "-f", "-"); err != nil {
		t.Errorf("removing Knative's webhook configurations: %v: %s", err, out)
	}
	// Pods gone first: a namespace being deleted with pods in their grace
	// period is looked at again only when that period would end.
	c.Kubectl(ctx, "-n", "knative-serving", "scale", "deployment", "--all", "--replicas=0")
	c.Kubectl(ctx, "-n", "knative-serving", "delete", "pods", "--all", "--grace-period=1", "--wait=true", "--timeout=60s")
	if out, err := c.KubectlStdin(ctx, core, "delete", "--ignore-not-found", "--wait=false", "-f", "-"); err != nil {
		t.Errorf("removing Knative Serving: %v: %s", err, out)
	}
	if out, err := c.Kubectl(ctx, "wait", "--for=delete", "namespace/knative-serving", "--timeout=90s"); err != nil {
		t.Errorf("namespace knative-serving not gone: %v: %s", err, out)
	}
}

// pollFor calls check until it reports done or timeout passes; the error
// then says why, in check's words.
func pollFor(ctx context.Context, timeout time.Duration, check func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, why := check()
		if ok {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("after %v: %s", timeout, why)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
