package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// TestLendingInServedPod: in a pod annotated cpuslot.dev/lend-ratio 0.5
// with a CPU limit of 1 (a budget of 1000m), `probe lend` fills the budget
// with two 500m leases; while the first sleeps a 250m lease is admitted at
// once (into the 250m it lends); once it wakes the lent quota is back (the
// agent cut the borrower) and another 250m is not admitted within its wait.
func TestLendingInServedPod(t *testing.T) {
	c := cluster.Need(t, kc)
	const ns, appNS, release = "cpuslot-system", "e2e-lend", "cpuslot"
	installChart(t, c, release, ns)
	namespace(t, c, appNS)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pod := strings.Replace(fmt.Sprintf(annotatedPod, "fn", appNS, cluster.ProbeImage, `["serve"]`),
		`    cpuslot.dev/enabled: "true"`, `    cpuslot.dev/enabled: "true"`+"\n"+`    cpuslot.dev/lend-ratio: "0.5"`, 1)
	if out, err := c.Apply(ctx, pod); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := c.Kubectl(ctx, "-n", appNS, "wait", "--for=condition=Ready", "pod/fn", "--timeout=90s"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitServed(ctx, t, c, ns, appNS, "fn", "fn", 3)
	out, err := c.Kubectl(ctx, "-n", appNS, "exec", "fn", "--", "/probe", "lend")
	if err != nil {
		t.Fatalf("probe lend: %v: %s", err, out)
	}
	var r struct {
		Lend          bool   `json:"lend"`
		Borrowed      bool   `json:"borrowed"`
		BorrowerMilli uint32 `json:"borrowerMilli"`
		BorrowerErr   string `json:"borrowerErr"`
		AfterWake     bool   `json:"afterWake"`
		AfterWakeErr  string `json:"afterWakeErr"`
	}
	if err := json.Unmarshal([]byte(cluster.ProbeResult(out)), &r); err != nil {
		t.Fatalf("probe lend: %v: %q", err, out)
	}
	t.Logf("probe lend: %+v", r)
	switch {
	case !r.Lend:
		t.Fatalf("the agent did not say LEND to a pod annotated with lend-ratio 0.5")
	case !r.Borrowed || r.BorrowerMilli != 250:
		t.Fatalf("a 250m lease beside a sleeping 500m one in a full budget: admitted %v at %dm (%s); want 250m lent", r.Borrowed, r.BorrowerMilli, r.BorrowerErr)
	case r.AfterWake:
		t.Fatalf("after the wake a 250m lease was admitted into a full budget: the lent quota was not taken back")
	}
}
