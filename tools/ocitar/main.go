// Command ocitar writes a container image as an OCI image-layout tarball,
// without a Docker engine or a registry, for `ctr images import` (or a push
// with any OCI tool: `crane push`, `skopeo copy oci-archive:`):
//
//	ocitar -o agent.tar -name docker.io/cpuslot/node-agent:v0.1.0 \
//	    -arch amd64,arm64 -entrypoint /node-agent \
//	    -add 'bin/node-agent-linux-{arch}:/node-agent' \
//	    -annotation org.opencontainers.image.revision=$(git rev-parse HEAD)
//
// The image is an index (go-containerregistry writes it) with one manifest
// per -arch, each of one gzip-compressed layer holding the -add files and
// directories (modes and symlinks kept, owned by root, times at the epoch);
// {arch} in an -add source is that manifest's architecture. The index and
// every manifest carry the -annotation values, and
// org.opencontainers.image.created when SOURCE_DATE_EPOCH is set (the
// output is reproducible either way); index.json names the image with
// io.containerd.image.name so containerd imports it under that name. The
// index's digest, what a deployment pins, is printed as NAME@DIGEST.
package main

import (
	"archive/tar"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	out := flag.String("o", "", "output tarball")
	name := flag.String("name", "", "full image name with tag, e.g. docker.io/cpuslot/node-agent:v0.1.0")
	workdir := flag.String("workdir", "/", "working directory")
	user := flag.String("user", "", "user to run as, e.g. 65534:65534")
	arch := flag.String("arch", runtime.GOARCH, "comma-separated architectures (linux), one manifest each; {arch} in an -add source is replaced by each")
	var adds, env, entrypoint, cmd, annotations listFlag
	flag.Var(&adds, "add", "SRC:DST, a host file or directory copied into the image; repeatable")
	flag.Var(&env, "env", "K=V; repeatable")
	flag.Var(&entrypoint, "entrypoint", "entrypoint argument; repeatable")
	flag.Var(&cmd, "cmd", "command argument; repeatable")
	flag.Var(&annotations, "annotation", "K=V on the index and every manifest, e.g. org.opencontainers.image.revision=SHA; repeatable")
	flag.Parse()
	if *out == "" || *name == "" || len(adds) == 0 {
		fmt.Fprintln(os.Stderr, "ocitar: need -o, -name and at least one -add")
		flag.Usage()
		os.Exit(2)
	}
	img := Image{Name: *name, Workdir: *workdir, User: *user, Env: env, Entrypoint: entrypoint, Cmd: cmd,
		Arch: strings.Split(*arch, ","), Annotations: map[string]string{}}
	for _, a := range adds {
		src, dst, ok := strings.Cut(a, ":")
		if !ok || src == "" || !strings.HasPrefix(dst, "/") {
			fmt.Fprintf(os.Stderr, "ocitar: -add %q: want SRC:/ABSOLUTE/DST\n", a)
			os.Exit(2)
		}
		img.Adds = append(img.Adds, Add{Src: src, Dst: dst})
	}
	for _, a := range annotations {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			fmt.Fprintf(os.Stderr, "ocitar: -annotation %q: want K=V\n", a)
			os.Exit(2)
		}
		img.Annotations[k] = v
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "ocitar: SOURCE_DATE_EPOCH %q: not a number of seconds\n", s)
			os.Exit(2)
		}
		img.Created = time.Unix(sec, 0).UTC()
	}
	// Written beside and renamed when complete: a reader that waits for the
	// tarball (make e2e imports it while it is built) never sees half of one.
	partial := *out + ".partial"
	f, err := os.Create(partial)
	var digest v1.Hash
	if err == nil {
		digest, err = img.Write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Rename(partial, *out)
	}
	if err != nil {
		os.Remove(partial)
		fmt.Fprintln(os.Stderr, "ocitar:", err)
		os.Exit(1)
	}
	fmt.Printf("%s@%s\n", *name, digest)
}

// Add copies a host path into the image.
type Add struct{ Src, Dst string }

// Image describes what to write.
type Image struct {
	Name                 string
	Workdir, User        string
	Env, Entrypoint, Cmd []string
	Adds                 []Add
	// Arch lists the linux architectures, one manifest each (amd64 when empty).
	Arch []string
	// Annotations go on the index and on every manifest.
	Annotations map[string]string
	// Created, when set, is the config's creation time and the
	// org.opencontainers.image.created annotation; else the epoch, unannotated.
	Created time.Time
}

// Write writes the image layout as a tar stream and returns the digest of
// its index.
func (img Image) Write(w io.Writer) (v1.Hash, error) {
	ref := img.Name[strings.LastIndex(img.Name, "/")+1:]
	_, tag, ok := strings.Cut(ref, ":")
	if !ok || tag == "" {
		return v1.Hash{}, fmt.Errorf("image name %q needs a tag", img.Name)
	}
	ann := map[string]string{}
	for k, v := range img.Annotations {
		ann[k] = v
	}
	created := epoch
	if !img.Created.IsZero() {
		created = img.Created
		ann["org.opencontainers.image.created"] = created.Format(time.RFC3339)
	}
	arches := img.Arch
	if len(arches) == 0 {
		arches = []string{"amd64"}
	}
	stage, err := os.MkdirTemp("", "ocitar")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(stage)

	var index v1.ImageIndex = empty.Index
	for _, arch := range arches {
		if arch == "" || strings.ContainsAny(arch, "/{}") {
			return v1.Hash{}, fmt.Errorf("architecture %q: want e.g. amd64 or arm64", arch)
		}
		layerFile := filepath.Join(stage, "layer-"+arch+".tar")
		if err := img.writeLayer(layerFile, arch); err != nil {
			return v1.Hash{}, err
		}
		layer, err := tarball.LayerFromFile(layerFile, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
		if err != nil {
			return v1.Hash{}, err
		}
		base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
		cfg := &v1.ConfigFile{
			Architecture: arch, OS: "linux", Created: v1.Time{Time: created},
			Config: v1.Config{
				Env:        append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, img.Env...),
				Entrypoint: img.Entrypoint, Cmd: img.Cmd, WorkingDir: img.Workdir, User: img.User,
			},
			RootFS: v1.RootFS{Type: "layers"},
		}
		if base, err = mutate.ConfigFile(base, cfg); err != nil {
			return v1.Hash{}, err
		}
		if base, err = mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "ocitar"}}); err != nil {
			return v1.Hash{}, err
		}
		im := mutate.Annotations(base, ann).(v1.Image)
		index = mutate.AppendManifests(index, mutate.IndexAddendum{Add: im,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	index = mutate.Annotations(index, ann).(v1.ImageIndex)

	// index.json points at the index, under the name containerd imports.
	dir := filepath.Join(stage, "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendIndex(index, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          img.Name,
		"org.opencontainers.image.ref.name": tag,
	})); err != nil {
		return v1.Hash{}, err
	}
	digest, err := index.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	return digest, tarDir(w, dir)
}

// tarDir writes dir's regular files and directories in sorted order, with
// fixed modes and times: the same layout gives the same bytes.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		name := filepath.ToSlash(rel)
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Name: name + "/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir})
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: fi.Size(), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// epoch keeps the output reproducible.
var epoch = time.Unix(0, 0).UTC()

// writeLayer writes every added path for arch ({arch} in a source replaced),
// with parent directories, in sorted order, as an uncompressed tar file.
func (img Image) writeLayer(file, arch string) error {
	type entry struct {
		dst string
		src string // "" for a directory made up for a parent
	}
	entries := map[string]entry{}
	addParents := func(dst string) {
		for d := path.Dir(dst); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = entry{dst: d}
			}
		}
	}
	for _, a := range img.Adds {
		root := filepath.Clean(strings.ReplaceAll(a.Src, "{arch}", arch))
		err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			dst := path.Clean(path.Join(a.Dst, filepath.ToSlash(rel)))
			entries[dst] = entry{dst: dst, src: p}
			addParents(dst)
			return nil
		})
		if err != nil {
			return fmt.Errorf("-add %s: %w", root, err)
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	defer out.Close()
	tw := tar.NewWriter(out)
	for _, n := range names {
		e := entries[n]
		name := strings.TrimPrefix(n, "/")
		if e.src == "" {
			if err := tw.WriteHeader(&tar.Header{Name: name + "/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir}); err != nil {
				return err
			}
			continue
		}
		fi, err := os.Lstat(e.src)
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(e.src); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, h.ModTime, h.AccessTime, h.ChangeTime = name, epoch, time.Time{}, time.Time{}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(e.src)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return out.Close()
}
