package pool

import (
	"fmt"
	"strings"

	"github.com/cpuslot/cpuslot/internal/settings"
)

// Mode is how a pool finds and places slots. All four are real so that the
// benchmark compares them on equal terms.
type Mode int

const (
	// Affinity (the default): prefer the free slot of the quota the thread
	// already sits in (no cgroup write); else a free slot of the quota, the
	// thread placing itself by writing "0" to the slot's fd; else retune a
	// free slot the thread sits in; else create.
	Affinity Mode = iota
	// CacheLazy: per-quota cache of pre-made slots, placement by numeric TID;
	// a thread stays in its slot after release until another thread needs
	// the slot ("CGroup Caching @ Graalvisor", lazy reclamation).
	CacheLazy
	// CacheEager: as CacheLazy, but the thread is moved out on release
	// (the same thesis, non-lazy reclamation).
	CacheEager
	// Uncached: create a cgroup per invocation, set its quota, place, and
	// remove it on release ("Performance Isolation in GraalVM Native Image
	// Isolates").
	Uncached
)

// modeNames are the settings' mode choices, in Mode's order.
var modeNames = settings.Modes

func (m Mode) String() string { return modeNames[m] }

// ParseMode reads a mode name.
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if s == n {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("mode %q: want one of %s", s, strings.Join(modeNames, ", "))
}

// ParseQuota reads a CPU quantity ("250m", "1", "1.5") in millicores.
func ParseQuota(s string) (uint32, error) { return settings.ParseQuota(s) }

// FormatQuota writes millicores the way ParseQuota reads them.
func FormatQuota(m uint32) string { return settings.FormatQuota(m) }

// ParsePrewarm reads a spec such as "250m=8,500m=4,1=2".
func ParsePrewarm(s string) (map[uint32]int, error) { return settings.ParsePrewarm(s) }

// FormatPrewarm writes a prewarm map in ParsePrewarm's syntax.
func FormatPrewarm(p map[uint32]int) string { return settings.FormatPrewarm(p) }
