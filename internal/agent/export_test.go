package agent

// SetPrepareHook runs f before each container's pool is made (tests only).
func SetPrepareHook(f func(cgroupPath string)) { prepareHook = f }
