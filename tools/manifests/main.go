// Command manifests writes the files generated from the Helm chart and the
// deploy recipes (deploy/cpuslot.yaml, deploy/prometheus/cpuslot-rules.yml,
// charts/cpuslot/queries.txt, deploy/openwhisk/action-pod.example.yaml).
// The tests of charts/cpuslot and deploy fail while a committed file
// differs from what this writes.
//
//	manifests [REPO]   (make manifests; REPO: the repository's root, default ..)
package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	chart "github.com/cpuslot/cpuslot/charts/cpuslot"
	"github.com/cpuslot/cpuslot/deploy"
)

func main() {
	root := ".."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	if err := run(root); err != nil {
		fmt.Fprintln(os.Stderr, "manifests:", err)
		os.Exit(1)
	}
}

func run(root string) error {
	c, err := chart.Open(root)
	if err != nil {
		return err
	}
	files, err := c.Generate()
	if err != nil {
		return err
	}
	more, err := deploy.Generate(root)
	if err != nil {
		return err
	}
	maps.Copy(files, more)
	for _, path := range slices.Sorted(maps.Keys(files)) {
		if err := os.WriteFile(filepath.Join(root, path), []byte(files[path]), 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", path)
	}
	return nil
}
