package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTailFile: the last lines of a log far longer than what is read.
func TestTailFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	var b strings.Builder
	for i := 0; i < 100000; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := TailFile(path, 2), "line 99998\nline 99999"; got != want {
		t.Fatalf("TailFile = %q, want %q", got, want)
	}
	if got := TailFile(filepath.Join(t.TempDir(), "none"), 2); got != "" {
		t.Fatalf("a missing file: %q", got)
	}
}
