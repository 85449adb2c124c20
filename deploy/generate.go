// Package deploy generates the files of the recipes in deploy/ that are
// derived from others: openwhisk/action-pod.example.yaml, the action pod
// OpenWhisk's invoker makes from this recipe. `make manifests` writes it;
// the recipes' tests check that the committed file equals what Generate
// makes.
package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

// ActionPodFile is the generated example, relative to the repository's
// root.
const ActionPodFile = "deploy/openwhisk/action-pod.example.yaml"

// Generate returns every generated file's content by its path relative to
// the repository's root.
func Generate(root string) (map[string]string, error) {
	pod, err := owActionPod(filepath.Join(root, "deploy"))
	if err != nil {
		return nil, err
	}
	ex, err := actionPodExample(pod)
	if err != nil {
		return nil, err
	}
	return map[string]string{ActionPodFile: ex}, nil
}

// invokerEnv reads the env entries of kustomize/invoker-patch.yaml.
func invokerEnv(dir string) (map[string]corev1.EnvVar, error) {
	var patch struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   any    `json:"metadata"`
		Spec       struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}
	if err := readYAML(filepath.Join(dir, "openwhisk/kustomize/invoker-patch.yaml"), &patch); err != nil {
		return nil, err
	}
	out := map[string]corev1.EnvVar{}
	for _, c := range patch.Spec.Template.Spec.Containers {
		if c.Name == "invoker" {
			for _, e := range c.Env {
				out[e.Name] = e
			}
		}
	}
	return out, nil
}

// owActionPod builds the action pod the way OpenWhisk's WhiskPodBuilder
// (core/invoker/.../kubernetes/WhiskPodBuilder.scala) does from the pod
// template: name and labels, restartPolicy, node affinity, and in the
// "user-action" container resources (memory, and CPU with cpu-scaling),
// image, env (replaced by __OW_API_HOST + containerArgs.extraEnvVars),
// port 8080 "action", dropped capabilities.
func owActionPod(dir string) (*corev1.Pod, error) {
	var pod corev1.Pod
	if err := readYAML(filepath.Join(dir, "openwhisk/kustomize/pod-template.yaml"), &pod); err != nil {
		return nil, err
	}
	env, err := invokerEnv(dir)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(env["CONFIG_whisk_kubernetes_podTemplate"].Value, "/pod-template.yaml") {
		return nil, fmt.Errorf("invoker-patch.yaml does not point whisk.kubernetes.pod-template at pod-template.yaml: %v", env["CONFIG_whisk_kubernetes_podTemplate"])
	}
	name := "wskowdev-invoker-00-1-guest-fib"
	pod.Name = name
	pod.Labels = map[string]string{"name": name, "user-action-pod": "true", "invoker": "invoker0", "release": "owdev"}
	pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "openwhisk-role", Operator: corev1.NodeSelectorOpIn, Values: []string{"invoker"}}},
		}}},
	}}
	idx := -1
	for i, c := range pod.Spec.Containers {
		if c.Name == "user-action" {
			idx = i
		}
	}
	if idx < 0 {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{})
		idx = len(pod.Spec.Containers) - 1
	}
	c := &pod.Spec.Containers[idx]
	// an action created with --memory 2048: cpu-scaling 250m per 256 MB
	millicpus, _ := resource.ParseQuantity(env["CONFIG_whisk_kubernetes_cpuScaling_millicpus"].Value + "m")
	res := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2048Mi")}
	if !millicpus.IsZero() {
		res[corev1.ResourceCPU] = *resource.NewMilliQuantity(millicpus.MilliValue()*2048/256, resource.DecimalSI)
	}
	c.Resources = corev1.ResourceRequirements{Limits: res, Requests: res.DeepCopy()}
	c.Name = "user-action"
	c.Image = "cpuslot/runtime-jvm:0.1.0"
	c.Env = []corev1.EnvVar{{Name: "__OW_API_HOST", Value: "http://owdev-nginx.openwhisk.svc.cluster.local:80"}}
	for i := 0; i < 10; i++ {
		v, ok := env["CONFIG_whisk_containerFactory_containerArgs_extraEnvVars_"+string(rune('0'+i))]
		if i == 0 && !ok { // set by the openwhisk-deploy-kube chart itself
			v, ok = corev1.EnvVar{Value: "__OW_ALLOW_CONCURRENT=true"}, true
		}
		if ok {
			k, val, _ := strings.Cut(v.Value, "=")
			c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: val})
		}
	}
	c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: 8080, Name: "action"})
	if c.SecurityContext == nil {
		c.SecurityContext = &corev1.SecurityContext{}
	}
	c.SecurityContext.Capabilities = &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW", "NET_ADMIN"}}
	return &pod, nil
}

// actionPodExample is openwhisk/action-pod.example.yaml for the pod.
func actionPodExample(pod *corev1.Pod) (string, error) {
	pod = pod.DeepCopy()
	pod.TypeMeta.APIVersion, pod.TypeMeta.Kind = "v1", "Pod"
	b, err := yaml.Marshal(pod)
	if err != nil {
		return "", err
	}
	b = regexp.MustCompile(`(?m)^\s*creationTimestamp: null\n`).ReplaceAll(b, nil)
	b = regexp.MustCompile(`(?m)^(\s*)resources: \{\}\n`).ReplaceAll(b, nil)
	b = regexp.MustCompile(`(?m)^status: \{\}\n`).ReplaceAll(b, nil)
	return `# The action pod OpenWhisk's invoker (KubernetesContainerFactory) creates
# from kustomize/pod-template.yaml with this recipe's invoker settings, for
# an action created with --memory 2048 (kind java:cpuslot). Built by
# deploy/generate.go the way WhiskPodBuilder.scala builds it: a simulation,
# not captured from a running OpenWhisk. Generated by ` + "`make manifests`" + `.
# The invoker later adds labels openwhisk/action and openwhisk/namespace.
` + string(b), nil
}

// readYAML reads a file strictly: an unknown field is an error.
func readYAML(path string, into any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	return nil
}
