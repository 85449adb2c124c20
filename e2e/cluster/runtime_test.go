package cluster

import (
	"net/http"
	"testing"
	"time"
)

func TestActivationShare(t *testing.T) {
	h := http.Header{}
	h.Set("X-Cpuslot-Cpu-Ns", "250000000")
	share, wall, err := ActivationShare(h, []byte(`{"wall_ms": 1000}`))
	if err != nil || share != 0.25 || wall != time.Second {
		t.Errorf("250 ms of CPU in 1 s: %v %v %v, want 0.25 1s nil", share, wall, err)
	}
	for _, c := range []struct {
		cpu, body string
	}{
		{"", `{"wall_ms": 1000}`},
		{"x", `{"wall_ms": 1000}`},
		{"1", `{"wall_ms": 0}`},
		{"1", `{}`},
		{"1", `not json`},
	} {
		h := http.Header{}
		h.Set("X-Cpuslot-Cpu-Ns", c.cpu)
		if _, _, err := ActivationShare(h, []byte(c.body)); err == nil {
			t.Errorf("cpu %q reply %s: no error", c.cpu, c.body)
		}
	}
}
