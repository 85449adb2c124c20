package health

import (
	"strings"
	"testing"
	"time"
)

// TestLoop: a loop waiting for work is never stalled; one whose work in
// hand began more than the limit ago is, named, until that work ends.
func TestLoop(t *testing.T) {
	l := &Loop{Name: "accept loop on /run/x.sock"}
	later := time.Now().Add(time.Hour)
	if err := l.Stalled(later, time.Minute); err != nil {
		t.Fatalf("idle loop: %v", err)
	}
	l.Begin()
	if err := l.Stalled(time.Now(), time.Minute); err != nil {
		t.Fatalf("work just begun: %v", err)
	}
	err := l.Stalled(later, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "accept loop on /run/x.sock stalled") {
		t.Fatalf("work begun an hour before: %v", err)
	}
	l.End()
	if err := l.Stalled(later, time.Minute); err != nil {
		t.Fatalf("work ended: %v", err)
	}
}
