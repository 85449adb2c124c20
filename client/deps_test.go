package client_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// allowedDeps are the only non-standard packages a runtime linking the Go
// client may pull in: the client must not bring the agent's dependencies
// (cgroup libraries, D-Bus, systemd, logging) into every runtime.
var allowedDeps = map[string]bool{
	"github.com/cpuslot/cpuslot/client":      true,
	"github.com/cpuslot/cpuslot/api/slot/v1": true,
	"github.com/cpuslot/cpuslot/counters":    true,
	"golang.org/x/sys/unix":                  true,
}

func TestClientDependencies(t *testing.T) {
	out, err := exec.Command(goTool(t), "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps printed no packages; the check would pass vacuously")
	}
	for _, d := range deps {
		if !allowedDeps[d] {
			t.Errorf("the client depends on %s; allowed: the client, api/slot/v1, counters, golang.org/x/sys/unix", d)
		}
	}
}

// goTool finds the go command that runs the tests: on PATH, else in GOROOT.
func goTool(t *testing.T) string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if root := os.Getenv("GOROOT"); root != "" {
		return filepath.Join(root, "bin", "go")
	}
	t.Fatal("no go command on PATH and GOROOT unset: cannot list the client's dependencies")
	return ""
}
