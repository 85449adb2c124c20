// Command ocitar writes a container image as an OCI image-layout tarball,
// without a Docker engine or a registry, for `ctr images import`:
//
//	ocitar -o agent.tar -name docker.io/cpuslot/node-agent:dev \
//	    -entrypoint /node-agent -add bin/node-agent:/node-agent
//
// The image has one uncompressed layer holding the -add files and
// directories (modes and symlinks kept, owned by root), and an index whose
// manifest carries io.containerd.image.name so containerd names it.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	out := flag.String("o", "", "output tarball")
	name := flag.String("name", "", "full image name with tag, e.g. docker.io/cpuslot/node-agent:dev")
	workdir := flag.String("workdir", "/", "working directory")
	user := flag.String("user", "", "user to run as, e.g. 65534:65534")
	var adds, env, entrypoint, cmd listFlag
	flag.Var(&adds, "add", "SRC:DST, a host file or directory copied into the image; repeatable")
	flag.Var(&env, "env", "K=V; repeatable")
	flag.Var(&entrypoint, "entrypoint", "entrypoint argument; repeatable")
	flag.Var(&cmd, "cmd", "command argument; repeatable")
	flag.Parse()
	if *out == "" || *name == "" || len(adds) == 0 {
		fmt.Fprintln(os.Stderr, "ocitar: need -o, -name and at least one -add")
		flag.Usage()
		os.Exit(2)
	}
	img := Image{Name: *name, Workdir: *workdir, User: *user, Env: env, Entrypoint: entrypoint, Cmd: cmd}
	for _, a := range adds {
		src, dst, ok := strings.Cut(a, ":")
		if !ok || src == "" || !strings.HasPrefix(dst, "/") {
			fmt.Fprintf(os.Stderr, "ocitar: -add %q: want SRC:/ABSOLUTE/DST\n", a)
			os.Exit(2)
		}
		img.Adds = append(img.Adds, Add{Src: src, Dst: dst})
	}
	f, err := os.Create(*out)
	if err == nil {
		err = img.Write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		os.Remove(*out)
		fmt.Fprintln(os.Stderr, "ocitar:", err)
		os.Exit(1)
	}
}

// Add copies a host path into the image.
type Add struct{ Src, Dst string }

// Image describes what to write.
type Image struct {
	Name                 string
	Workdir, User        string
	Env, Entrypoint, Cmd []string
	Adds                 []Add
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Write writes the image layout as a tar stream.
func (img Image) Write(w io.Writer) error {
	var layer bytes.Buffer
	if err := img.layer(&layer); err != nil {
		return err
	}
	layerDesc := digestOf("application/vnd.oci.image.layer.v1.tar", layer.Bytes())
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, img.Env...)
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{
			"Env": env, "Entrypoint": img.Entrypoint, "Cmd": img.Cmd, "WorkingDir": img.Workdir, "User": img.User,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	configDesc := digestOf("application/vnd.oci.image.config.v1+json", config)
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []descriptor{layerDesc},
	})
	manifestDesc := digestOf("application/vnd.oci.image.manifest.v1+json", manifest)
	tag := img.Name[strings.LastIndex(img.Name, ":")+1:]
	if !strings.Contains(img.Name[strings.LastIndex(img.Name, "/")+1:], ":") {
		return fmt.Errorf("image name %q needs a tag", img.Name)
	}
	manifestDesc.Annotations = map[string]string{
		"io.containerd.image.name":          img.Name,
		"org.opencontainers.image.ref.name": tag,
	}
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []descriptor{manifestDesc},
	})

	tw := tar.NewWriter(w)
	put := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir}); err != nil {
			return err
		}
	}
	for _, b := range []struct {
		d    descriptor
		data []byte
	}{{layerDesc, layer.Bytes()}, {configDesc, config}, {manifestDesc, manifest}} {
		if err := put("blobs/sha256/"+strings.TrimPrefix(b.d.Digest, "sha256:"), b.data); err != nil {
			return err
		}
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", index); err != nil {
		return err
	}
	return tw.Close()
}

// epoch keeps the output reproducible.
var epoch = time.Unix(0, 0)

func digestOf(mediaType string, b []byte) descriptor {
	sum := sha256.Sum256(b)
	return descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b))}
}

// layer writes every added path, with parent directories, in sorted order.
func (img Image) layer(w io.Writer) error {
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
		root := filepath.Clean(a.Src)
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
			return fmt.Errorf("-add %s: %w", a.Src, err)
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
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
	return tw.Close()
}
