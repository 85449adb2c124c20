package pool

import "github.com/cpuslot/cpuslot/internal/settings"

// Mode is how a pool finds and places slots (settings parses it). Each
// mode's file registers its implementation (registerMode). All four are
// real so that the benchmark compares them on equal terms.
type Mode = settings.Mode

// ParseQuota reads a CPU quantity ("250m", "1", "1.5") in millicores.
func ParseQuota(s string) (uint32, error) { return settings.ParseQuota(s) }

// FormatQuota writes millicores the way ParseQuota reads them.
func FormatQuota(m uint32) string { return settings.FormatQuota(m) }

// ParsePrewarm reads a spec such as "250m=8,500m=4,1=2".
func ParsePrewarm(s string) (map[uint32]int, error) { return settings.ParsePrewarm(s) }

// FormatPrewarm writes a prewarm map in ParsePrewarm's syntax.
func FormatPrewarm(p map[uint32]int) string { return settings.FormatPrewarm(p) }
