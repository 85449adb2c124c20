package server

import "os"

// Child runs the child side of one of this package's own tests when the
// environment names one (ok false: it names none); TestMain, in
// main_test.go, calls it.
func Child() (code int, ok bool) {
	if sock := os.Getenv("CPUSLOT_TEST_OPENER"); sock != "" {
		return openAndPass(sock, os.Getenv("CPUSLOT_TEST_HELLO")), true
	}
	if sock := os.Getenv("CPUSLOT_TEST_CHURN"); sock != "" {
		return churn(sock), true
	}
	return 0, false
}

// SetIdentifyHooks pauses each connection before its peer is identified
// (before, nil: none) and has peerCreds act as on a kernel without
// SO_PEERPIDFD (noPeerPIDFD). Set them before the agent starts.
func SetIdentifyHooks(noPeerPIDFD bool, before func()) {
	testHookNoPeerPIDFD, testHookBeforeIdentify = noPeerPIDFD, before
}
