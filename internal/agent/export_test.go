package agent

import "time"

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

// SetMaintainHook runs f at the start of each maintenance round, and sets
// the least stall /healthz reports; it returns a function that restores
// both.
func SetMaintainHook(f func(), stall time.Duration) func() {
	h, m := maintainHook, minStall
	maintainHook, minStall = f, stall
	return func() { maintainHook, minStall = h, m }
}

// ScanLeasedSlots runs the scan of exposed slots leased now, which runs
// every second between maintenance rounds.
func (a *Agent) ScanLeasedSlots() { a.evictForeign(true) }
