package agent

// SetPrepareHook runs f before each container's pool is made (tests only).
func SetPrepareHook(f func(cgroupPath string)) { prepareHook = f }

// LeftoverRounds is how many maintenance rounds retry a torn-down
// container's busy slots before they are given up.
const LeftoverRounds = leftoverRounds

// SetForeignScanBounds sets the foreign-thread scan's bounds and returns a
// function that restores them.
func SetForeignScanBounds(perRound, perContainer int) func() {
	r, c := foreignScanPerRound, foreignScanPerContainer
	foreignScanPerRound, foreignScanPerContainer = perRound, perContainer
	return func() { foreignScanPerRound, foreignScanPerContainer = r, c }
}

// ScanLeasedSlots runs the scan of exposed slots leased now, which runs
// every second between maintenance rounds.
func (a *Agent) ScanLeasedSlots() { a.evictForeign(true) }
