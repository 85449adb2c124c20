// Command gen rewrites the files generated from settings.Keys: the table of
// docs/settings.md and the pool and admission sections of the chart's
// configuration template (charts/cpuslot/templates/_helpers.tpl):
// go run ./internal/settings/gen [repository root] (make settings-doc).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cpuslot/cpuslot/internal/settings"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	for _, g := range []struct {
		path    string
		rewrite func(string) (string, error)
	}{
		{"docs/settings.md", settings.RewriteDoc},
		{"charts/cpuslot/templates/_helpers.tpl", settings.RewriteChartConfig},
	} {
		if err := run(filepath.Join(root, g.path), g.rewrite); err != nil {
			fmt.Fprintln(os.Stderr, "settings-doc:", err)
			os.Exit(1)
		}
	}
}

func run(path string, rewrite func(string) (string, error)) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := rewrite(string(b))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(out), 0o644)
}
