package agent

// SetPrepareHook runs f before each container's pool is made (tests only).
func SetPrepareHook(f func(cgroupPath string)) { prepareHook = f }

// LeftoverRounds is how many maintenance rounds retry a torn-down
// container's busy slots before they are given up.
const LeftoverRounds = leftoverRounds
