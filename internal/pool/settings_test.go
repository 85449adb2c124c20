package pool

import (
	"testing"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// New keeps what the settings say and fills the node's CPUs for an unset
// largest quota.
func TestNewFromSettings(t *testing.T) {
	s := settings.Default()
	for key, v := range map[string]string{"pool.mode": "cache-eager", "admission.policy": "degrade", "pool.maxSlots": "9", "admission.budget": "1500m"} {
		if err := s.Set(key, v); err != nil {
			t.Fatal(err)
		}
	}
	p, err := New("test", s, newFake(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.mode != modes[CacheEager] || p.budget.Policy != admission.Degrade || p.cfg.MaxSlots != 9 || p.budget.Limit != 1500 || p.maxQuota() != settings.NodeMaxQuota() {
		t.Fatalf("%+v", p.cfg)
	}
}

// Every mode settings offers has an implementation its file registered, so
// New refuses none of them.
func TestEveryModeRegistered(t *testing.T) {
	for _, m := range settings.AllModes {
		if modes[m] == nil {
			t.Errorf("mode %s has no implementation", m)
		}
	}
	if len(modes) != len(settings.Modes) {
		t.Errorf("%d implementations for %d modes", len(modes), len(settings.Modes))
	}
}
