package main

import (
	"runtime"
	"testing"
)

// The lend client gives every worker thread a P and one more, and never
// lowers GOMAXPROCS.
func TestProcsForWorkers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(2)
	procsForWorkers(8)
	if got := runtime.GOMAXPROCS(0); got != 9 {
		t.Fatalf("GOMAXPROCS %d for 8 workers, want 9", got)
	}
	procsForWorkers(3)
	if got := runtime.GOMAXPROCS(0); got != 9 {
		t.Fatalf("GOMAXPROCS lowered to %d for 3 workers, want 9 kept", got)
	}
}
