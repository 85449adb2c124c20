package cluster

import (
	"os"
	"path/filepath"
	"strings"
)

// Image names of the tarballs `make images` writes into bin/images/ (see
// the Makefile's images target): fully qualified, non-latest tags, so the
// kubelet never tries to pull them.
const (
	// PauseImage is containerd's sandbox_image (e2e/images/pause).
	PauseImage = "docker.io/cpuslot/pause:e2e"
	// ProbeImage is the tests' general-purpose container (e2e/images/probe).
	ProbeImage = "docker.io/cpuslot/e2e-probe:e2e"
	// AgentImage is bin/node-agent.
	AgentImage = "docker.io/cpuslot/node-agent:dev"
	// RuntimeJavaImage is the Java runtime for Java functions only (the
	// image OpenWhisk's java kind maps to; no JavaScript or Python engine):
	// bin/cpuslot-runtime-java.tar (only the v2 node imports it).
	RuntimeJavaImage = "docker.io/cpuslot/runtime-java:dev"
)

// ContainerCgroupDir is where the kubelet (cgroupfs driver, as this cluster
// runs it) puts a container's cgroup: on cgroup v1 under the controller's
// hierarchy (e.g. "cpu"), on v2 under the unified one (controller ignored).
// qosClass is the pod's status.qosClass; Guaranteed pods sit directly under
// kubepods.
func ContainerCgroupDir(controller, qosClass, podUID, containerID string) string {
	base := filepath.Join("/sys/fs/cgroup", controller)
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		base = "/sys/fs/cgroup"
	}
	parts := []string{base, "kubepods"}
	if q := strings.ToLower(qosClass); q != "" && q != "guaranteed" {
		parts = append(parts, q)
	}
	return filepath.Join(append(parts, "pod"+podUID, containerID)...)
}

// ProbeResult is the result line of a probe command run through kubectl
// exec, which interleaves the probe's log (stderr) with its result (stdout)
// in any order: the last line that is a JSON object ("" if none).
func ProbeResult(out string) string {
	result := ""
	for _, line := range strings.Split(out, "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "{") {
			result = line
		}
	}
	return result
}
