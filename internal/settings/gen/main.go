// Command gen rewrites the table of docs/settings.md from settings.Keys:
// go run ./internal/settings/gen [docs/settings.md] (make settings-doc).
package main

import (
	"fmt"
	"os"

	"github.com/cpuslot/cpuslot/internal/settings"
)

func main() {
	path := "docs/settings.md"
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	if err := run(path); err != nil {
		fmt.Fprintln(os.Stderr, "settings-doc:", err)
		os.Exit(1)
	}
}

func run(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := settings.RewriteDoc(string(b))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(out), 0o644)
}
