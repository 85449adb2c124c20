// Command dashboards writes the chart's dashboards from their one
// definition (model.go): the Grafana dashboards (charts/cpuslot/dashboards/
// *.json, built with the Grafana Foundation SDK's types) and the same
// dashboards for Perses (charts/cpuslot/dashboards/perses/*.json). Its
// test fails while a committed file differs from what this writes.
//
//	dashboards [REPO]   (make dashboards; REPO: the repository's root, default ..)
package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

// Where the files go, relative to the repository's root.
const (
	grafanaDir = "charts/cpuslot/dashboards"
	persesDir  = "charts/cpuslot/dashboards/perses"
)

func main() {
	root := ".."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	if err := run(root); err != nil {
		fmt.Fprintln(os.Stderr, "dashboards:", err)
		os.Exit(1)
	}
}

func run(root string) error {
	files, err := generate()
	if err != nil {
		return err
	}
	for _, path := range slices.Sorted(maps.Keys(files)) {
		full := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, files[path], 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", path)
	}
	return nil
}

// generate returns every file's content by its path relative to the
// repository's root.
func generate() (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, d := range Dashboards {
		g, err := grafanaJSON(d)
		if err != nil {
			return nil, err
		}
		files[filepath.Join(grafanaDir, d.File+".json")] = g
		p, err := persesJSON(d)
		if err != nil {
			return nil, err
		}
		files[filepath.Join(persesDir, d.File+".json")] = p
	}
	return files, nil
}
