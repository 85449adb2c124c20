package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"time"
)

// SamplesJar is the path of the samples jar, the actions every runtime test
// sends; make runtime-image (and make images) builds it.
func SamplesJar(repo string) (string, error) {
	jars, _ := filepath.Glob(filepath.Join(repo, "runtime-image", "samples", "target", "samples-*.jar"))
	if len(jars) == 0 {
		return "", errors.New("runtime-image/samples/target/samples-*.jar missing (make images builds it)")
	}
	return jars[0], nil
}

// ActivationShare is the share of a CPU one activation of the samples'
// CPU-bound action had: the CPU time the runtime reports in its
// X-Cpuslot-Cpu-Ns header over the wall time in the reply's wall_ms. The runtime
// sends that header only to a request that asks for it (X-Cpuslot-Usage: reply).
func ActivationShare(h http.Header, body []byte) (share float64, wall time.Duration, err error) {
	cpu, err := strconv.ParseInt(h.Get("X-Cpuslot-Cpu-Ns"), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("X-Cpuslot-Cpu-Ns %q: %v", h.Get("X-Cpuslot-Cpu-Ns"), err)
	}
	var reply struct {
		WallMS float64 `json:"wall_ms"`
	}
	if err := json.Unmarshal(body, &reply); err != nil || reply.WallMS <= 0 {
		return 0, 0, fmt.Errorf("reply %s: no wall_ms", body)
	}
	wall = time.Duration(reply.WallMS * 1e6)
	return float64(cpu) / float64(wall), wall, nil
}
