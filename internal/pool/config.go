package pool

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/cgroup"
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

// Config shapes one container's pool.
type Config struct {
	// Prewarm is how many slots of each quota (millicores) to keep ready.
	Prewarm map[uint32]int
	Mode    Mode
	Limit   cgroup.Limit
	// PeriodUS is the CFS period of every slot.
	PeriodUS uint32
	// MaxSlots bounds the slots of the container (pre-warmed and grown).
	MaxSlots int
	// IdleTimeout is how long a grown slot may stay free before removal.
	IdleTimeout time.Duration
	// DefaultWait is the wait budget of a request that gives none; MaxWait
	// caps any request's.
	DefaultWait, MaxWait time.Duration
	// BudgetMilli is the admission budget before overcommit; 0 = the
	// container's CPU limit, or unlimited when it has none.
	BudgetMilli uint32
	Overcommit  float64
	Policy      admission.Policy
	// MinDegradedMilli is the smallest quota a degraded grant gets.
	MinDegradedMilli uint32
	// MaxQuotaMilli bounds the quota of a request to a container without a
	// CPU limit (one with a limit is bounded by it). Default: the node's
	// CPUs.
	MaxQuotaMilli uint32
	// MaxActions bounds the distinct action names one container gets as
	// metric labels; later names are counted as "_other".
	MaxActions int
}

// DefaultMaxActions is the default per-container cap on action labels.
const DefaultMaxActions = settings.DefaultMaxActions

// NodeMaxQuota is the default quota bound: the CPUs the agent may run on.
func NodeMaxQuota() uint32 { return settings.NodeMaxQuota() }

// DefaultConfig is what a pool gets when nothing is configured.
func DefaultConfig() Config {
	c, err := ConfigFrom(settings.Default())
	if err != nil {
		panic("pool: default settings refused: " + err.Error())
	}
	return c
}

// ConfigFrom converts a container's settings (flags, file, annotations)
// into a pool's configuration, and validates it.
func ConfigFrom(s settings.Pool) (Config, error) {
	c := Config{
		Prewarm: s.Prewarm, Limit: s.Limit, PeriodUS: s.PeriodUS, MaxSlots: s.MaxSlots,
		IdleTimeout: s.IdleTimeout, DefaultWait: s.DefaultWait, MaxWait: s.MaxWait,
		BudgetMilli: s.BudgetMilli, Overcommit: s.Overcommit, MinDegradedMilli: s.MinDegradedMilli,
		MaxQuotaMilli: s.MaxQuotaMilli, MaxActions: s.MaxActions,
	}
	if c.MaxQuotaMilli == 0 {
		c.MaxQuotaMilli = NodeMaxQuota()
	}
	var err error
	if c.Mode, err = ParseMode(s.Mode); err != nil {
		return c, err
	}
	if c.Policy, err = admission.ParsePolicy(s.Policy); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate checks a config for contradictions.
func (c Config) Validate() error {
	total := 0
	for q, n := range c.Prewarm {
		if err := (cgroup.Spec{QuotaMilli: q, PeriodUS: c.PeriodUS, Limit: c.Limit}).Validate(); err != nil {
			return fmt.Errorf("prewarm %dm: %w", q, err)
		}
		if n < 0 {
			return fmt.Errorf("prewarm %dm: negative count", q)
		}
		if q > c.MaxQuotaMilli {
			return fmt.Errorf("prewarm %dm: above the largest quota of %dm", q, c.MaxQuotaMilli)
		}
		total += n
	}
	if c.MaxQuotaMilli < 1 || c.MaxQuotaMilli > 1_000_000 {
		return fmt.Errorf("maxQuota %dm: must be within 1m..1000 cores", c.MaxQuotaMilli)
	}
	if c.MaxActions < 1 {
		return fmt.Errorf("maxActions %d: must be at least 1", c.MaxActions)
	}
	if c.MaxSlots < 1 {
		return fmt.Errorf("maxSlots %d: must be at least 1", c.MaxSlots)
	}
	if total > c.MaxSlots {
		return fmt.Errorf("prewarm asks for %d slots, more than maxSlots %d", total, c.MaxSlots)
	}
	if c.Overcommit < 0 || math.IsNaN(c.Overcommit) {
		return fmt.Errorf("overcommit %v: must be positive", c.Overcommit)
	}
	if c.DefaultWait < 0 || c.MaxWait < 0 {
		return fmt.Errorf("wait budgets must not be negative")
	}
	return nil
}

// ParseQuota reads a CPU quantity ("250m", "1", "1.5") in millicores.
func ParseQuota(s string) (uint32, error) { return settings.ParseQuota(s) }

// FormatQuota writes millicores the way ParseQuota reads them.
func FormatQuota(m uint32) string { return settings.FormatQuota(m) }

// ParsePrewarm reads a spec such as "250m=8,500m=4,1=2".
func ParsePrewarm(s string) (map[uint32]int, error) { return settings.ParsePrewarm(s) }

// FormatPrewarm writes a prewarm map in ParsePrewarm's syntax.
func FormatPrewarm(p map[uint32]int) string { return settings.FormatPrewarm(p) }
