package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// Without an agent every invocation runs, without a slot, and the answer
// says so.
func TestInvokeWithoutAgent(t *testing.T) {
	iv := newInvoker(250, time.Millisecond)
	for i := 0; i < 3; i++ {
		w := httptest.NewRecorder()
		iv.ServeHTTP(w, httptest.NewRequest("GET", "/invoke", nil))
		if w.Code != http.StatusNoContent || w.Header().Get("X-Cpuslot-Slot") != "none" {
			t.Fatalf("invocation %d: %d, X-Cpuslot-Slot %q, want 204 and none", i, w.Code, w.Header().Get("X-Cpuslot-Slot"))
		}
	}
}
