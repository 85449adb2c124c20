// Command gen rewrites the files generated from settings.Keys
// (settings.Targets: the table of docs/settings.md, the chart's values,
// schema, README rows and configuration template, docs/agent.example.yaml
// and the agent file's structs):
// go run ./internal/settings/gen [repository root] (make settings-doc).
package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cpuslot/cpuslot/internal/settings"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	for _, t := range settings.Targets {
		if err := run(filepath.Join(root, t.Path), t.Rewrite); err != nil {
			fmt.Fprintln(os.Stderr, "settings-doc:", err)
			os.Exit(1)
		}
	}
}

func run(path string, rewrite func(string) (string, error)) error {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err // a file generated whole may not exist yet
	}
	out, err := rewrite(string(b))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if out == string(b) {
		return nil
	}
	return os.WriteFile(path, []byte(out), 0o644)
}
