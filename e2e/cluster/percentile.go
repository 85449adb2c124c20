package cluster

import (
	"slices"
	"time"
)

// Percentile is the p-quantile (0 to 1) of d by nearest rank, the lower
// one; 0 for no sample. The tests log latency ratios with it.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1))]
}
