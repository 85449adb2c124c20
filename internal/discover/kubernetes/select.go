// Package kubernetes discovers the runtime pods on this node (client-go,
// field selector on spec.nodeName), resolves each served container's cgroup
// through containerd, and reports them to the agent with a per-pod socket
// inside the pod's emptyDir volume. docs/kubernetes-contract.md is the
// contract with the chart and with runtime pods.
package kubernetes

import (
	"fmt"
	"math"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/cpuslot/cpuslot/internal/settings"
)

// Annotations and labels cpuslot reads; the pool settings' annotations are
// in settings.Keys.
const (
	AnnEnabled   = settings.AnnotationPrefix + "enabled"
	AnnContainer = settings.AnnotationPrefix + "container"
	// AnnCPUQuota is the runtime's pod default quota (deploy/knative reads
	// it through the downward API); the agent only checks it fits.
	AnnCPUQuota       = settings.AnnotationPrefix + "cpu-quota"
	LabelOpenWhisk    = "user-action-pod"
	ContainerOW       = "user-action"
	LabelKnative      = "serving.knative.dev/revision"
	ContainerKnative  = "user-container"
	DefaultVolumeName = "cpuslot"
)

// Selector says which pods are served.
type Selector struct {
	OpenWhisk, Knative, Annotated bool
}

// ParseSelector reads a list such as ["openwhisk", "knative", "annotated"].
func ParseSelector(kinds []string) (Selector, error) {
	var s Selector
	for _, k := range kinds {
		switch k {
		case "openwhisk":
			s.OpenWhisk = true
		case "knative":
			s.Knative = true
		case "annotated":
			s.Annotated = true
		default:
			return s, fmt.Errorf("kubernetes.select %q: want openwhisk, knative or annotated", k)
		}
	}
	return s, nil
}

// ServedContainer returns the name of the pod's container to serve, or ""
// with the reason it is not served.
func (s Selector) ServedContainer(pod *corev1.Pod) (string, string) {
	name, why := s.Named(pod.Labels, pod.Annotations)
	if why != "" {
		return "", why
	}
	if name == FirstContainer {
		if len(pod.Spec.Containers) == 0 {
			return "", "pod has no containers"
		}
		name = pod.Spec.Containers[0].Name
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == name {
			return name, ""
		}
	}
	return "", fmt.Sprintf("pod has no container %q", name)
}

// FirstContainer is what Named returns for the pod's first container,
// which only the pod's spec tells (an annotated pod without
// cpuslot.dev/container).
const FirstContainer = "\x00first"

// Named is the container a pod's labels and annotations select (the same
// rules whether they come from the API or from the runtime's sandbox), or
// "" with the reason none is.
func (s Selector) Named(labels, ann map[string]string) (string, string) {
	switch ann[AnnEnabled] {
	case "false":
		return "", "opted out by " + AnnEnabled
	}
	name := ""
	switch {
	case s.Annotated && ann[AnnEnabled] == "true":
		name = FirstContainer
	case s.OpenWhisk && labels[LabelOpenWhisk] == "true":
		name = ContainerOW
	case s.Knative && labels[LabelKnative] != "":
		name = ContainerKnative
	default:
		return "", "not a runtime pod"
	}
	if c := ann[AnnContainer]; c != "" {
		name = c
	}
	return name, ""
}

// ContainerName names a served container in logs, metrics and HELLO,
// whichever path found it.
func ContainerName(namespace, pod, container string) string {
	return namespace + "/" + pod + "/" + container
}

// CheckQuotaAnnotation reports a cpuslot.dev/cpu-quota annotation that
// cannot be served: unparsable, or above the served container's CPU limit
// (the agent refuses such a slot, so every invocation at that quota would
// run without one).
func CheckQuotaAnnotation(pod *corev1.Pod, container string) error {
	v, ok := pod.Annotations[AnnCPUQuota]
	if !ok {
		return nil
	}
	q, err := settings.ParseQuota(v)
	if err != nil {
		return fmt.Errorf("%s=%q: %v", AnnCPUQuota, v, err)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name != container {
			continue
		}
		if lim, ok := c.Resources.Limits[corev1.ResourceCPU]; ok && lim.MilliValue() > 0 && int64(q) > lim.MilliValue() {
			return fmt.Errorf("%s=%q is above container %s's CPU limit %dm: invocations at that quota get no slot and run without one",
				AnnCPUQuota, v, container, lim.MilliValue())
		}
	}
	return nil
}

// CPULimit is a container's CPU limit as the kubelet reports it applied
// (status, which an in-place resize changes once it is done), else as the
// spec asks; "" when it has none.
func CPULimit(pod *corev1.Pod, container string) string {
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == container && st.Resources != nil {
			if lim, ok := st.Resources.Limits[corev1.ResourceCPU]; ok && !lim.IsZero() {
				return lim.String()
			}
			return ""
		}
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == container {
			if lim, ok := c.Resources.Limits[corev1.ResourceCPU]; ok && !lim.IsZero() {
				return lim.String()
			}
		}
	}
	return ""
}

// SpecCPULimitMilli is the CPU limit a container's spec asks for, in
// millicores (0: none); an in-place resize changes it before the kubelet
// applies it.
func SpecCPULimitMilli(pod *corev1.Pod, container string) uint32 {
	for _, c := range pod.Spec.Containers {
		if c.Name == container {
			if lim, ok := c.Resources.Limits[corev1.ResourceCPU]; ok && lim.MilliValue() > 0 {
				return uint32(min(lim.MilliValue(), math.MaxUint32))
			}
		}
	}
	return 0
}

// HasVolume reports whether the pod declares the emptyDir the agent puts
// its socket in.
func HasVolume(pod *corev1.Pod, volume string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Name == volume && v.EmptyDir != nil {
			return true
		}
	}
	return false
}

// SocketPath is where the agent creates a pod's socket: inside the pod's
// emptyDir volume, as the kubelet lays it out on the node.
func SocketPath(podsDir, podUID, volume string) string {
	return path.Join(podsDir, podUID, "volumes", "kubernetes.io~empty-dir", volume, "agent.sock")
}

// PoolConfig applies a pod's annotations (settings.Keys with an
// Annotation, under settings.AnnotationPrefix) to the chart's defaults, through the
// same parser as the agent's flags and file. A bad value keeps the default
// for that field and is returned as an error, so the pod is still served
// and the operator sees why it differs. A value above the operator's
// ceiling is clamped to it and returned as a *settings.Clamped; limitMilli
// is the container's CPU limit (0: none), the default budget ceiling.
func PoolConfig(base settings.Pool, ceil settings.Ceilings, ann map[string]string, limitMilli uint32) (settings.Pool, []error) {
	c := base
	var errs []error
	for _, k := range settings.Keys {
		if k.Annotation == "" {
			continue
		}
		name := settings.AnnotationPrefix + k.Annotation
		v, ok := ann[name]
		if !ok {
			continue
		}
		if err := c.Set(k.Name, v); err != nil {
			if se, ok := err.(*settings.Error); ok {
				se.Source = name
			}
			errs = append(errs, err)
			continue
		}
		if err := ceil.Clamp(k.Name, &c, limitMilli); err != nil {
			err.(*settings.Clamped).Source = name
			errs = append(errs, err)
		}
	}
	if err := c.Validate(); err != nil {
		// The combination is invalid (e.g. prewarm above maxSlots): fall
		// back to the defaults altogether.
		errs = append(errs, fmt.Errorf("annotations together: %v; using defaults", err))
		return base, errs
	}
	return c, errs
}

// CgroupFromSpec turns an OCI spec's cgroupsPath into a path in the cgroup
// hierarchy. The cgroupfs driver writes the path itself; the systemd
// driver writes "slice:prefix:name", which systemd expands to nested
// slices ("kubepods-burstable-pod1.slice" lives in "kubepods.slice/
// kubepods-burstable.slice") and a scope "prefix-name.scope".
func CgroupFromSpec(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty cgroupsPath")
	}
	if strings.HasPrefix(p, "/") {
		return path.Clean(p), nil
	}
	parts := strings.Split(p, ":")
	if len(parts) != 3 {
		return "", fmt.Errorf("cgroupsPath %q is neither a path nor slice:prefix:name", p)
	}
	slice, prefix, name := parts[0], parts[1], parts[2]
	dir := "/"
	if slice != "" && slice != "-.slice" {
		base, ok := strings.CutSuffix(slice, ".slice")
		if !ok || base == "" || strings.Contains(base, "/") {
			return "", fmt.Errorf("cgroupsPath %q: bad slice %q", p, slice)
		}
		acc := ""
		for _, comp := range strings.Split(base, "-") {
			if comp == "" {
				return "", fmt.Errorf("cgroupsPath %q: bad slice %q", p, slice)
			}
			if acc == "" {
				acc = comp
			} else {
				acc += "-" + comp
			}
			dir = path.Join(dir, acc+".slice")
		}
	}
	unit := name
	if !strings.HasSuffix(name, ".slice") {
		if prefix != "" {
			unit = prefix + "-" + name
		}
		unit += ".scope"
	}
	return path.Join(dir, unit), nil
}
