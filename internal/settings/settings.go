// Package settings is the one definition of a container's pool and
// admission settings: their keys, defaults and validation. The agent's
// flags, its YAML file and pod annotations all set them through Pool.Set,
// so a value is accepted or refused the same way whichever source gives it;
// every file that lists the settings (the chart's values, schema and
// template, the docs, the file's structs) is generated from Keys
// (generate.go, Targets), with the agent-wide keys of AgentKeys (agent.go),
// which no Pool holds. A pool is made from a Pool as it is; discover
// carries it without importing pool.
package settings

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cpuslot/cpuslot/internal/admission"
	"github.com/cpuslot/cpuslot/internal/cgroup"
)

// Kinds of error a bad value gets; every error of Set wraps one of them
// in an *Error that names the key.
var (
	ErrUnknownKey = errors.New("unknown setting")
	ErrSyntax     = errors.New("malformed")
	ErrRange      = errors.New("out of range")
	ErrChoice     = errors.New("not one of the choices")
)

// Error is a refused value: which key, what was given, and why.
type Error struct {
	// Key is the setting's name in the file, e.g. "admission.overcommit".
	Key string
	// Source is how the source spelled the key (a flag, an annotation),
	// when it differs from Key; the message uses it.
	Source string
	Value  string
	Err    error
}

// maxQuoted bounds how much of a refused value a message repeats: values
// come from pods too, and messages become Events and log lines.
const maxQuoted = 64

func (e *Error) Error() string {
	name := e.Key
	if e.Source != "" {
		name = e.Source
	}
	return fmt.Sprintf("%s=%s: %v", name, quote(e.Value), e.Err)
}

// quote quotes at most maxQuoted bytes of s.
func quote(s string) string {
	if len(s) > maxQuoted {
		return fmt.Sprintf("%q... (%d bytes)", s[:maxQuoted], len(s))
	}
	return strconv.Quote(s)
}

func (e *Error) Unwrap() error { return e.Err }

// Pool is one container's pool and admission settings, parsed.
type Pool struct {
	// Prewarm is how many slots of each quota (millicores) to keep ready.
	Prewarm map[uint32]int
	Mode    Mode
	Limit   cgroup.Limit
	// PeriodUS is the CFS period of every slot.
	PeriodUS uint32
	// MaxSlots bounds the slots of the container (pre-warmed and grown).
	MaxSlots    int
	IdleTimeout time.Duration
	// DefaultWait is the wait budget of a request that gives none; MaxWait
	// caps any request's.
	DefaultWait, MaxWait time.Duration
	// MaxQuotaMilli bounds a request's quota in a container without a CPU
	// limit; 0: the node's CPUs (NodeMaxQuota).
	MaxQuotaMilli uint32
	// MaxActions bounds the distinct action names per container in metrics.
	MaxActions int
	// BudgetMilli is the admission budget before overcommit; 0: the
	// container's CPU limit, or unlimited when it has none.
	BudgetMilli uint32
	Overcommit  float64
	// LendRatio is the share of a sleeping lease's quota admission lends
	// to new leases (0: no lending; docs/lending.md).
	LendRatio float64
	Policy    admission.Policy
	// MinDegradedMilli is the smallest quota a degraded grant gets.
	MinDegradedMilli uint32
}

// Mode is how a pool finds and places slots; its value is its name. Each
// mode's file in the pool registers its implementation under one (what it
// does is documented there).
type Mode string

const (
	ModeAffinity   Mode = "affinity"
	ModeCacheLazy  Mode = "cache-lazy"
	ModeCacheEager Mode = "cache-eager"
	ModeUncached   Mode = "uncached"
)

// AllModes are the modes, in the order the docs and the benchmark list them.
var AllModes = []Mode{ModeAffinity, ModeCacheLazy, ModeCacheEager, ModeUncached}

// ParseMode reads a mode's name.
func ParseMode(s string) (Mode, error) {
	if m := Mode(s); slices.Contains(AllModes, m) {
		return m, nil
	}
	return "", fmt.Errorf("mode %q: want one of %s", s, strings.Join(Modes, ", "))
}

// The choices of the enumerated settings, as the keys offer them.
var (
	Modes    = names(AllModes)
	Limits   = []string{"cap", "share", "both"}
	Policies = names(admission.Policies)
)

func names[T ~string](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

// Defaults other packages name.
const (
	DefaultMinDegradedMilli = 50
	DefaultMaxActions       = 32
)

// Default is what a pool gets when nothing is configured.
func Default() Pool {
	return Pool{
		Prewarm:          map[uint32]int{250: 4, 500: 2, 1000: 2},
		Mode:             ModeAffinity,
		Limit:            cgroup.LimitCap,
		PeriodUS:         cgroup.DefaultPeriodUS,
		MaxSlots:         64,
		IdleTimeout:      2 * time.Minute,
		DefaultWait:      100 * time.Millisecond,
		MaxWait:          10 * time.Second,
		MaxActions:       DefaultMaxActions,
		Overcommit:       1,
		Policy:           admission.Queue,
		MinDegradedMilli: DefaultMinDegradedMilli,
	}
}

// NodeMaxQuota is the default quota bound: the CPUs the agent may run on.
func NodeMaxQuota() uint32 { return uint32(min(runtime.NumCPU(), 1_000_000/1000) * 1000) }

// Kind is the syntax of a setting's value.
type Kind int

const (
	KindPrewarm  Kind = iota // QUOTA=COUNT,...
	KindChoice               // one of Key.Choices
	KindDuration             // Go duration, within Key.Min..Key.Max (seconds)
	KindInt                  // integer within Key.Min..Key.Max
	KindNumber               // number in (Key.Min, Key.Max]
	KindQuantity             // CPU quantity (250m, 1, 1.5); Optional: "" allowed
	KindFraction             // number in [Key.Min, Key.Max], both included
	KindBool                 // true or false
	KindString               // text, Key.Min..Key.Max bytes long, matching Key.Pattern
	KindList                 // a list of Key.Choices, each once; Set's syntax: comma-separated
)

// AnnotationPrefix starts every pod annotation cpuslot reads.
const AnnotationPrefix = "cpuslot.dev/"

// Key is one setting and every name it goes by.
type Key struct {
	// Name is its path in the agent's YAML file and the chart's values.
	Name string
	// Flag is the agent's command-line flag, without the dash.
	Flag string
	// Annotation is the pod annotation's name after AnnotationPrefix; empty:
	// not settable per pod.
	Annotation string
	Kind       Kind
	Choices    []string
	// Min and Max bound numbers (Max 0: unbounded), durations (in
	// seconds) and a string's length.
	Min, Max float64
	// Pattern is a regular expression a string or duration must match
	// (JSON Schema's pattern: found anywhere unless anchored).
	Pattern string
	// Optional means the empty string is a value (see Doc).
	Optional bool
	// EmptyMeans is what an Optional key's empty value stands for, when
	// it is a default rather than nothing (docs/settings.md).
	EmptyMeans string
	// Default is an agent-wide key's default (AgentKeys), in Set's syntax;
	// a pool or admission key's is Default()'s.
	Default string
	// NoChart: not a value of the chart (the chart's agent never needs it).
	NoChart bool
	// Chart is the key's path in the chart's values when it is not Name
	// (the file's kubernetes.nri.enabled is the chart's nri.enabled).
	Chart string
	// ChartFrom is the chart template's expression of the value when the
	// chart derives it from a value written by hand among the chart's own
	// (http from metrics.port): the key is then no generated chart value.
	ChartFrom string
	// ChartDoc is the docs' chart cell when it is not the chart value.
	ChartDoc string
	// Rule checks the key against other settings of the file (get reads
	// one in Set's syntax), on the whole configuration: what no single
	// value shows, written by hand (AgentKeys only).
	Rule func(get func(key string) string) error
	// Doc is the flag's help.
	Doc string
	// Meaning is the docs' longer Markdown text, when Doc is not enough.
	Meaning string
	// get and set read and write the key in a Pool, in Set's syntax (nil
	// for AgentKeys).
	get func(Pool) string
	set func(*Pool, string) error
}

const noMax = 0

// Keys is every setting, in the order of the file.
var Keys = []Key{
	{Name: "pool.prewarm", Flag: "prewarm", Annotation: "prewarm", Kind: KindPrewarm, Optional: true,
		Doc:     `slots kept ready per quota, e.g. 250m=8,500m=4,1=2 ("" = none)`,
		Meaning: "slots kept ready per quota",
		get:     func(p Pool) string { return FormatPrewarm(p.Prewarm) },
		set: func(p *Pool, v string) error {
			m, err := ParsePrewarm(v)
			if err == nil {
				p.Prewarm = m
			}
			return err
		}},
	{Name: "pool.mode", Flag: "mode", Annotation: "mode", Kind: KindChoice, Choices: Modes,
		Doc:     "pool mode: affinity, cache-lazy, cache-eager or uncached",
		Meaning: "how the pool finds and places slots ([`architecture.md`](architecture.md#pool-modes))",
		get:     func(p Pool) string { return string(p.Mode) },
		set:     func(p *Pool, v string) (err error) { p.Mode, err = ParseMode(v); return err }},
	{Name: "pool.limit", Flag: "limit", Annotation: "limit", Kind: KindChoice, Choices: Limits,
		Doc:     "how a slot limits CPU: cap, share or both",
		Meaning: "how a slot limits CPU: `cap` (`cpu.max` / `cpu.cfs_quota_us`), `share` (`cpu.weight` / `cpu.shares` in proportion to the quota: a work-conserving minimum), or `both` ([`cgroups.md`](cgroups.md))",
		get:     func(p Pool) string { return p.Limit.String() },
		set:     func(p *Pool, v string) (err error) { p.Limit, err = cgroup.ParseLimit(v); return err }},
	{Name: "pool.period", Flag: "period", Kind: KindDuration, Min: 0.001, Max: 1,
		Doc:     "CFS period of every slot, 1ms..1s",
		Meaning: "CFS period of every slot",
		get:     func(p Pool) string { return (time.Duration(p.PeriodUS) * time.Microsecond).String() },
		set: func(p *Pool, v string) error {
			d, _ := time.ParseDuration(v)
			p.PeriodUS = uint32(d.Microseconds())
			return nil
		}},
	{Name: "pool.maxSlots", Flag: "max-slots", Annotation: "max-slots", Kind: KindInt, Min: 1, Max: 4096,
		Doc: "slots per container, pre-warmed and grown",
		get: func(p Pool) string { return strconv.Itoa(p.MaxSlots) },
		set: func(p *Pool, v string) error { p.MaxSlots, _ = strconv.Atoi(v); return nil }},
	{Name: "pool.idleTimeout", Flag: "idle-timeout", Kind: KindDuration, Min: 0, Max: noMax,
		Doc: "grown slots idle this long are removed",
		get: func(p Pool) string { return p.IdleTimeout.String() },
		set: func(p *Pool, v string) error { p.IdleTimeout, _ = time.ParseDuration(v); return nil }},
	{Name: "pool.defaultWait", Flag: "default-wait", Kind: KindDuration, Min: 0, Max: noMax,
		Doc: "wait budget of a request that gives none",
		get: func(p Pool) string { return p.DefaultWait.String() },
		set: func(p *Pool, v string) error { p.DefaultWait, _ = time.ParseDuration(v); return nil }},
	{Name: "pool.maxWait", Flag: "max-wait", Kind: KindDuration, Min: 0, Max: noMax,
		Doc: "cap on any request's wait budget",
		get: func(p Pool) string { return p.MaxWait.String() },
		set: func(p *Pool, v string) error { p.MaxWait, _ = time.ParseDuration(v); return nil }},
	{Name: "pool.maxQuota", Flag: "max-quota", Kind: KindQuantity, Optional: true,
		EmptyMeans: "the node's CPUs",
		Doc:        `largest quota a request may ask in a container without a CPU limit ("" = the node's CPUs)`,
		Meaning:    "largest quota a request may ask in a container without a CPU limit (with one: the limit)",
		get:        func(p Pool) string { return formatOptionalQuota(p.MaxQuotaMilli) },
		set:        func(p *Pool, v string) (err error) { p.MaxQuotaMilli, err = parseOptionalQuota(v, 0); return err }},
	{Name: "pool.maxActions", Flag: "max-actions", Kind: KindInt, Min: 1, Max: noMax,
		Doc:     "distinct action names per container in metrics; later ones are counted as _other",
		Meaning: "action names per container in metrics; later ones count as `_other`",
		get:     func(p Pool) string { return strconv.Itoa(p.MaxActions) },
		set:     func(p *Pool, v string) error { p.MaxActions, _ = strconv.Atoi(v); return nil }},
	{Name: "admission.budget", Flag: "budget", Annotation: "budget", Kind: KindQuantity, Optional: true,
		EmptyMeans: "the container's CPU limit",
		Doc:        `CPU budget per container ("" = the container's CPU limit, or unlimited when it has none)`,
		Meaning:    "CPU per container; unlimited when neither is set",
		get:        func(p Pool) string { return formatOptionalQuota(p.BudgetMilli) },
		set:        func(p *Pool, v string) (err error) { p.BudgetMilli, err = parseOptionalQuota(v, 0); return err }},
	{Name: "admission.overcommit", Flag: "overcommit", Annotation: "overcommit", Kind: KindNumber, Min: 0, Max: 100,
		Doc:     "budget multiplier, in (0, 100]",
		Meaning: "budget multiplier",
		get:     func(p Pool) string { return strconv.FormatFloat(p.Overcommit, 'g', -1, 64) },
		set:     func(p *Pool, v string) error { p.Overcommit, _ = strconv.ParseFloat(v, 64); return nil }},
	{Name: "admission.lendRatio", Flag: "lend-ratio", Annotation: "lend-ratio", Kind: KindFraction, Min: 0, Max: 1,
		Doc:     "share of a sleeping lease's quota lent to new leases, in [0, 1] (0 = no lending)",
		Meaning: "share of a sleeping lease's quota admission lends to new leases; 0: no lending; per action, the runtime can keep an action out ([`lending.md`](lending.md#semantics))",
		get:     func(p Pool) string { return strconv.FormatFloat(p.LendRatio, 'g', -1, 64) },
		set:     func(p *Pool, v string) error { p.LendRatio, _ = strconv.ParseFloat(v, 64); return nil }},
	{Name: "admission.policy", Flag: "policy", Annotation: "policy", Kind: KindChoice, Choices: Policies,
		Doc:     "when a quota does not fit the budget: queue, degrade or reject",
		Meaning: "`queue` (wait up to the request's budget), `degrade` (grant what is left now, raise it when budget frees), `reject`",
		get:     func(p Pool) string { return string(p.Policy) },
		set:     func(p *Pool, v string) (err error) { p.Policy, err = admission.ParsePolicy(v); return err }},
	{Name: "admission.minDegraded", Flag: "min-degraded", Kind: KindQuantity,
		Doc: "smallest quota a degraded grant gets",
		get: func(p Pool) string { return FormatQuota(p.MinDegradedMilli) },
		set: func(p *Pool, v string) (err error) { p.MinDegradedMilli, err = ParseQuota(v); return err }},
}

// Lookup finds a key by its name.
func Lookup(name string) (Key, bool) {
	i := slices.IndexFunc(Keys, func(k Key) bool { return k.Name == name })
	if i < 0 {
		return Key{}, false
	}
	return Keys[i], true
}

// Set parses value for the key and stores it. A refused value leaves p
// unchanged and returns an *Error naming the key.
func (p *Pool) Set(key, value string) error {
	k, ok := Lookup(key)
	if !ok {
		return &Error{Key: key, Value: value, Err: ErrUnknownKey}
	}
	if err := k.check(value); err != nil {
		return &Error{Key: key, Value: value, Err: err}
	}
	q := *p
	if err := k.set(&q, value); err != nil {
		return &Error{Key: key, Value: value, Err: err}
	}
	*p = q
	return nil
}

// Get returns the key's value in Set's syntax; "" for an unknown key.
func (p Pool) Get(key string) string {
	k, ok := Lookup(key)
	if !ok {
		return ""
	}
	return k.get(p)
}

// check validates a value's syntax and range for its kind.
func (k Key) check(v string) error {
	if v == "" && k.Optional {
		return nil
	}
	switch k.Kind {
	case KindBool:
		if v != "true" && v != "false" {
			return fmt.Errorf("%w: want true or false", ErrSyntax)
		}
	case KindChoice:
		if !slices.Contains(k.Choices, v) {
			return fmt.Errorf("%w: want %s", ErrChoice, strings.Join(k.Choices, ", "))
		}
	case KindList:
		items := strings.Split(v, ",")
		for i, item := range items {
			if v != "" && (!slices.Contains(k.Choices, item) || slices.Contains(items[:i], item)) {
				return fmt.Errorf("%w: want a list of %s, each once", ErrChoice, strings.Join(k.Choices, ", "))
			}
		}
	case KindQuantity:
		if _, err := ParseQuota(v); err != nil {
			return err
		}
	case KindString:
		if float64(len(v)) < k.Min || (k.Max != noMax && float64(len(v)) > k.Max) {
			return fmt.Errorf("%w: want %s bytes", ErrRange, k.RangeText())
		}
	case KindDuration:
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("%w: want a duration such as 100ms or 2m, %s", ErrSyntax, k.RangeText())
		}
		if s := d.Seconds(); s < k.Min || (k.Max != noMax && s > k.Max) {
			return fmt.Errorf("%w: want a duration %s", ErrRange, k.RangeText())
		}
	case KindInt:
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%w: want an integer %s", ErrSyntax, k.RangeText())
		}
		if float64(n) < k.Min || (k.Max != noMax && float64(n) > k.Max) {
			return fmt.Errorf("%w: want an integer %s", ErrRange, k.RangeText())
		}
	case KindNumber, KindFraction:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("%w: want a number %s", ErrSyntax, k.RangeText())
		}
		if f < k.Min || (f == k.Min && k.Kind == KindNumber) || (k.Max != noMax && f > k.Max) {
			return fmt.Errorf("%w: want a number %s", ErrRange, k.RangeText())
		}
	}
	if k.Pattern != "" && !regexp.MustCompile(k.Pattern).MatchString(v) {
		return fmt.Errorf("%w: want a value matching %s", ErrSyntax, k.Pattern)
	}
	return nil // prewarm is checked by its parser
}

// RangeText describes the accepted range, for messages and docs.
func (k Key) RangeText() string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	if k.Kind == KindDuration {
		f = func(x float64) string { return time.Duration(x * float64(time.Second)).String() }
	}
	switch {
	case k.Kind == KindNumber && k.Max == noMax:
		return "> " + f(k.Min)
	case k.Kind == KindNumber:
		return "in (" + f(k.Min) + ", " + f(k.Max) + "]"
	case k.Kind == KindFraction:
		return "in [" + f(k.Min) + ", " + f(k.Max) + "]"
	case k.Max == noMax:
		return ">= " + f(k.Min)
	}
	return "in " + f(k.Min) + ".." + f(k.Max)
}

// Validate checks what no single value shows: the settings together, and
// the bounds Set keeps for a Pool built in code rather than parsed.
func (p Pool) Validate() error {
	maxQuota := p.MaxQuotaMilli
	if maxQuota == 0 {
		maxQuota = NodeMaxQuota()
	}
	if maxQuota > 1_000_000 {
		return fmt.Errorf("maxQuota %dm: must be within 1m..1000 cores", maxQuota)
	}
	if _, err := ParseMode(string(p.Mode)); err != nil {
		return err
	}
	if _, err := admission.ParsePolicy(string(p.Policy)); err != nil {
		return err
	}
	switch {
	case p.MaxActions < 1:
		return fmt.Errorf("maxActions %d: must be at least 1", p.MaxActions)
	case p.MaxSlots < 1:
		return fmt.Errorf("maxSlots %d: must be at least 1", p.MaxSlots)
	case p.Overcommit < 0 || math.IsNaN(p.Overcommit):
		return fmt.Errorf("overcommit %v: must be positive", p.Overcommit)
	case !(p.LendRatio >= 0 && p.LendRatio <= 1):
		return fmt.Errorf("lendRatio %v: must be in [0, 1]", p.LendRatio)
	case p.DefaultWait < 0 || p.MaxWait < 0:
		return fmt.Errorf("wait budgets must not be negative")
	}
	total := 0
	for q, n := range p.Prewarm {
		if err := (cgroup.Spec{QuotaMilli: q, PeriodUS: p.PeriodUS, Limit: p.Limit}).Validate(); err != nil {
			return fmt.Errorf("prewarm %dm: %w", q, err)
		}
		if n < 0 {
			return fmt.Errorf("prewarm %dm: negative count", q)
		}
		if q > maxQuota {
			return fmt.Errorf("prewarm %dm: above the largest quota of %dm", q, maxQuota)
		}
		total += n
	}
	if len(p.Prewarm) > p.MaxSlots {
		// Entries of no slots cost nothing in the kernel but are carried by
		// every pool; a pod must not make that unbounded.
		return fmt.Errorf("prewarm lists %d quotas, more than maxSlots %d", len(p.Prewarm), p.MaxSlots)
	}
	if total > p.MaxSlots {
		return fmt.Errorf("prewarm asks for %d slots, more than maxSlots %d", total, p.MaxSlots)
	}
	return nil
}

func parseOptionalQuota(v string, empty uint32) (uint32, error) {
	if v == "" {
		return empty, nil
	}
	return ParseQuota(v)
}

func formatOptionalQuota(m uint32) string {
	if m == 0 {
		return ""
	}
	return FormatQuota(m)
}

// ParseQuota reads a CPU quantity as Kubernetes writes it: "250m", "1",
// "1.5", "0.25". The result is in millicores.
func ParseQuota(s string) (uint32, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("%w: empty quota", ErrSyntax)
	}
	var milli float64
	if v, ok := strings.CutSuffix(s, "m"); ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("%w: quota %s: want millicores like 250m or cores like 0.25", ErrSyntax, quote(s))
		}
		milli = float64(n)
	} else {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || strings.ContainsAny(s, "eEx_") {
			return 0, fmt.Errorf("%w: quota %s: want millicores like 250m or cores like 0.25", ErrSyntax, quote(s))
		}
		milli = f * 1000
		if milli != math.Trunc(milli) {
			return 0, fmt.Errorf("%w: quota %s: finer than a millicore", ErrSyntax, quote(s))
		}
	}
	if milli <= 0 {
		return 0, fmt.Errorf("%w: quota %s: must be positive", ErrRange, quote(s))
	}
	if milli > 1_000_000 {
		return 0, fmt.Errorf("%w: quota %s: above 1000 cores", ErrRange, quote(s))
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

// maxPrewarmEntries is the largest maxSlots: more quotas are always refused.
const maxPrewarmEntries = 4096

// ParsePrewarm reads a spec such as "250m=8,500m=4,1=2".
func ParsePrewarm(s string) (map[uint32]int, error) {
	out := map[uint32]int{}
	s = strings.TrimSpace(s)
	if s == "" {
		return out, nil
	}
	if n := strings.Count(s, ",") + 1; n > maxPrewarmEntries {
		return nil, fmt.Errorf("%w: %d prewarm entries, more than any maxSlots allows (%d)", ErrRange, n, maxPrewarmEntries)
	}
	for _, part := range strings.Split(s, ",") {
		q, n, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("%w: prewarm entry %s: want QUOTA=COUNT, e.g. 250m=8", ErrSyntax, quote(part))
		}
		milli, err := ParseQuota(q)
		if err != nil {
			return nil, fmt.Errorf("prewarm entry %s: %w", quote(part), err)
		}
		count, err := strconv.Atoi(strings.TrimSpace(n))
		if err != nil || count < 0 {
			return nil, fmt.Errorf("%w: prewarm entry %s: count must be a non-negative integer", ErrSyntax, quote(part))
		}
		if _, dup := out[milli]; dup {
			return nil, fmt.Errorf("%w: prewarm entry %s: quota given twice", ErrSyntax, quote(part))
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
