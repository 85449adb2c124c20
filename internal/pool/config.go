package pool

import (
	"fmt"
	"math"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/cgroup"
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

var modeNames = [...]string{"affinity", "cache-lazy", "cache-eager", "uncached"}

func (m Mode) String() string { return modeNames[m] }

// ParseMode reads a mode name.
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if s == n {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("mode %q: want one of %s", s, strings.Join(modeNames[:], ", "))
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
const DefaultMaxActions = 32

// NodeMaxQuota is the default quota bound: the CPUs the agent may run on.
func NodeMaxQuota() uint32 { return uint32(min(runtime.NumCPU(), 1_000_000/1000) * 1000) }

// DefaultConfig is what a pool gets when nothing is configured.
func DefaultConfig() Config {
	return Config{
		Prewarm:          map[uint32]int{250: 4, 500: 2, 1000: 2},
		Mode:             Affinity,
		Limit:            cgroup.LimitCap,
		PeriodUS:         cgroup.DefaultPeriodUS,
		MaxSlots:         64,
		IdleTimeout:      2 * time.Minute,
		DefaultWait:      100 * time.Millisecond,
		MaxWait:          10 * time.Second,
		Overcommit:       1,
		Policy:           admission.Queue,
		MinDegradedMilli: 50,
		MaxQuotaMilli:    NodeMaxQuota(),
		MaxActions:       DefaultMaxActions,
	}
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

// ParseQuota reads a CPU quantity as Kubernetes writes it: "250m", "1",
// "1.5", "0.25". The result is in millicores.
func ParseQuota(s string) (uint32, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty quota")
	}
	var milli float64
	if v, ok := strings.CutSuffix(s, "m"); ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("quota %q: want millicores like 250m or cores like 0.25", s)
		}
		milli = float64(n)
	} else {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || strings.ContainsAny(s, "eEx_") {
			return 0, fmt.Errorf("quota %q: want millicores like 250m or cores like 0.25", s)
		}
		milli = f * 1000
		if milli != math.Trunc(milli) {
			return 0, fmt.Errorf("quota %q: finer than a millicore", s)
		}
	}
	if milli <= 0 {
		return 0, fmt.Errorf("quota %q: must be positive", s)
	}
	if milli > 1_000_000 {
		return 0, fmt.Errorf("quota %q: above 1000 cores", s)
	}
	return uint32(milli), nil
}

// FormatQuota writes millicores the way ParseQuota reads them.
func FormatQuota(m uint32) string {
	if m%1000 == 0 {
		return strconv.FormatUint(uint64(m/1000), 10)
	}
	return strconv.FormatUint(uint64(m), 10) + "m"
}

// ParsePrewarm reads a spec such as "250m=8,500m=4,1=2".
func ParsePrewarm(s string) (map[uint32]int, error) {
	out := map[uint32]int{}
	s = strings.TrimSpace(s)
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		q, n, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("prewarm entry %q: want QUOTA=COUNT, e.g. 250m=8", part)
		}
		milli, err := ParseQuota(q)
		if err != nil {
			return nil, fmt.Errorf("prewarm entry %q: %w", part, err)
		}
		count, err := strconv.Atoi(strings.TrimSpace(n))
		if err != nil || count < 0 {
			return nil, fmt.Errorf("prewarm entry %q: count must be a non-negative integer", part)
		}
		if _, dup := out[milli]; dup {
			return nil, fmt.Errorf("prewarm entry %q: quota given twice", part)
		}
		out[milli] = count
	}
	return out, nil
}

// FormatPrewarm writes a prewarm map in ParsePrewarm's syntax.
func FormatPrewarm(p map[uint32]int) string {
	qs := make([]uint32, 0, len(p))
	for q := range p {
		qs = append(qs, q)
	}
	sort.Slice(qs, func(i, j int) bool { return qs[i] < qs[j] })
	parts := make([]string, len(qs))
	for i, q := range qs {
		parts[i] = fmt.Sprintf("%s=%d", FormatQuota(q), p[q])
	}
	return strings.Join(parts, ",")
}
