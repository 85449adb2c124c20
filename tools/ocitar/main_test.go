package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLayout checks the structure containerd's importer relies on: the
// layout marker, an index naming the image, and blobs whose names are their
// digests, with a layer holding the added files.
func TestLayout(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "app/lib"), 0o755)
	os.WriteFile(filepath.Join(dir, "app/run"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "app/lib/x.jar"), []byte("jar"), 0o644)
	os.Symlink("run", filepath.Join(dir, "app/start"))
	var buf bytes.Buffer
	img := Image{Name: "docker.io/cpuslot/test:v1", Workdir: "/", Entrypoint: []string{"/opt/app/run"},
		Adds: []Add{{Src: filepath.Join(dir, "app"), Dst: "/opt/app"}}}
	if err := img.Write(&buf); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Fatalf("oci-layout: %q", files["oci-layout"])
	}
	for name, b := range files {
		if hexd, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && hexd != "" {
			sum := sha256.Sum256(b)
			if hex.EncodeToString(sum[:]) != hexd {
				t.Errorf("blob %s does not match its digest", name)
			}
		}
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	json.Unmarshal(files["index.json"], &index)
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations["io.containerd.image.name"] != "docker.io/cpuslot/test:v1" {
		t.Fatalf("index: %s", files["index.json"])
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(index.Manifests[0].Digest, "sha256:")], &manifest)
	if len(manifest.Layers) != 1 || manifest.Config.Size == 0 {
		t.Fatalf("manifest: %+v", manifest)
	}
	layer := tar.NewReader(bytes.NewReader(files["blobs/sha256/"+strings.TrimPrefix(manifest.Layers[0].Digest, "sha256:")]))
	got := map[string]*tar.Header{}
	for {
		h, err := layer.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
	for _, want := range []string{"opt/", "opt/app/", "opt/app/lib/", "opt/app/run", "opt/app/lib/x.jar", "opt/app/start"} {
		if got[want] == nil {
			t.Errorf("layer lacks %s (has %v)", want, keys(got))
		}
	}
	if h := got["opt/app/run"]; h != nil && h.Mode&0o111 == 0 {
		t.Error("executable bit lost")
	}
	if h := got["opt/app/start"]; h != nil && (h.Typeflag != tar.TypeSymlink || h.Linkname != "run") {
		t.Error("symlink lost")
	}
	// The same input gives the same bytes.
	var again bytes.Buffer
	img.Write(&again)
	var first bytes.Buffer
	img.Write(&first)
	if !bytes.Equal(first.Bytes(), again.Bytes()) {
		t.Error("output not reproducible")
	}
}

func keys(m map[string]*tar.Header) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
