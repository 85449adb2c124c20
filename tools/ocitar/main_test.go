package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestLayout writes a two-architecture image and reads it back with
// go-containerregistry: the structure containerd's importer relies on (the
// layout marker, index.json naming the image), an index with one manifest
// per platform whose blobs match their digests, gzip layers holding that
// architecture's files, the annotations, and the digest printed for pinning.
func TestLayout(t *testing.T) {
	dir := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		os.MkdirAll(filepath.Join(dir, arch, "app/lib"), 0o755)
		os.WriteFile(filepath.Join(dir, arch, "app/run"), []byte("#!/bin/sh\n# "+arch+"\n"), 0o755)
		os.WriteFile(filepath.Join(dir, arch, "app/lib/x.jar"), []byte("jar"), 0o644)
		os.Symlink("run", filepath.Join(dir, arch, "app/start"))
	}
	img := Image{Name: "docker.io/cpuslot/test:v1", Workdir: "/", Entrypoint: []string{"/opt/app/run"},
		Arch:        []string{"amd64", "arm64"},
		Annotations: map[string]string{"org.opencontainers.image.revision": "abc123", "org.opencontainers.image.source": "https://example.com/cpuslot"},
		Created:     time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Adds:        []Add{{Src: filepath.Join(dir, "{arch}", "app"), Dst: "/opt/app"}}}
	var buf bytes.Buffer
	digest, err := img.Write(&buf)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	untar(t, buf.Bytes(), out)
	if b, _ := os.ReadFile(filepath.Join(out, "oci-layout")); !strings.Contains(string(b), `"imageLayoutVersion"`) {
		t.Fatalf("oci-layout: %q", b)
	}

	root, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	rm, err := root.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(rm.Manifests) != 1 || rm.Manifests[0].Annotations["io.containerd.image.name"] != img.Name ||
		rm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v1" || rm.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("index.json: %+v", rm.Manifests)
	}
	if rm.Manifests[0].Digest != digest {
		t.Errorf("Write returned %s, index.json points at %s", digest, rm.Manifests[0].Digest)
	}
	idx, err := root.ImageIndex(digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("index does not validate: %v", err)
	}
	im, _ := idx.IndexManifest()
	wantAnn := func(what string, got map[string]string) {
		t.Helper()
		for k, v := range map[string]string{"org.opencontainers.image.revision": "abc123",
			"org.opencontainers.image.source": "https://example.com/cpuslot", "org.opencontainers.image.created": "2026-01-02T03:04:05Z"} {
			if got[k] != v {
				t.Errorf("%s: annotation %s = %q, want %q", what, k, got[k], v)
			}
		}
	}
	wantAnn("index", im.Annotations)
	if len(im.Manifests) != 2 {
		t.Fatalf("manifests: %+v", im.Manifests)
	}
	for i, arch := range []string{"amd64", "arm64"} {
		d := im.Manifests[i]
		if d.Platform == nil || d.Platform.OS != "linux" || d.Platform.Architecture != arch || d.MediaType != types.OCIManifestSchema1 {
			t.Fatalf("manifest %d: %+v", i, d)
		}
		image, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := image.Manifest()
		wantAnn(arch+" manifest", m.Annotations)
		cfg, _ := image.ConfigFile()
		if cfg.Architecture != arch || cfg.OS != "linux" || !cfg.Created.Time.Equal(img.Created) ||
			len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/opt/app/run" {
			t.Errorf("%s config: %+v", arch, cfg)
		}
		layers, _ := image.Layers()
		if len(layers) != 1 {
			t.Fatalf("%s: %d layers", arch, len(layers))
		}
		if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
			t.Errorf("%s layer media type %s, want %s (gzip)", arch, mt, types.OCILayer)
		}
		got := layerFiles(t, layers[0])
		for _, want := range []string{"opt/", "opt/app/", "opt/app/lib/", "opt/app/run", "opt/app/lib/x.jar", "opt/app/start"} {
			if got[want] == nil {
				t.Errorf("%s layer lacks %s", arch, want)
			}
		}
		if h := got["opt/app/run"]; h != nil && (h.Mode&0o111 == 0 || h.Uid != 0 || !h.ModTime.Equal(epoch)) {
			t.Errorf("%s: run's header %+v: want executable, root's, at the epoch", arch, h)
		}
		if h := got["opt/app/start"]; h != nil && (h.Typeflag != tar.TypeSymlink || h.Linkname != "run") {
			t.Errorf("%s: symlink lost", arch)
		}
		if c := fileContent(t, layers[0], "opt/app/run"); !strings.Contains(c, arch) {
			t.Errorf("%s layer holds the run of another architecture: %q", arch, c)
		}
	}

	// The same input gives the same bytes and digest.
	var again bytes.Buffer
	if d, err := img.Write(&again); err != nil || d != digest || !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Errorf("output not reproducible: %v %s %s", err, d, digest)
	}
}

// TestBadInput: an untagged name, a bad architecture, a missing source are
// errors naming what is wrong.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	for _, c := range []struct {
		img  Image
		want string
	}{
		{Image{Name: "docker.io/cpuslot/test", Adds: []Add{{filepath.Join(dir, "f"), "/f"}}}, "needs a tag"},
		{Image{Name: "localhost:5000/test", Adds: []Add{{filepath.Join(dir, "f"), "/f"}}}, "needs a tag"},
		{Image{Name: "x/test:v1", Arch: []string{"linux/arm64"}, Adds: []Add{{filepath.Join(dir, "f"), "/f"}}}, "architecture"},
		{Image{Name: "x/test:v1", Arch: []string{"arm64"}, Adds: []Add{{filepath.Join(dir, "{arch}"), "/f"}}}, "arm64"},
	} {
		_, err := c.img.Write(io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want one naming %q", c.img, err, c.want)
		}
	}
}

func untar(t *testing.T, b []byte, dir string) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			os.MkdirAll(p, 0o755)
			continue
		}
		data, _ := io.ReadAll(tr)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func layerFiles(t *testing.T, l v1.Layer) map[string]*tar.Header {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
}

func fileContent(t *testing.T, l v1.Layer, name string) string {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s not in layer: %v", name, err)
		}
		if h.Name == name {
			b, _ := io.ReadAll(tr)
			return string(b)
		}
	}
}
