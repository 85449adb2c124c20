package cgroup

import (
	"errors"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
)

func TestDetectPicksHostMounts(t *testing.T) {
	// A privileged pod on v1: the runtime mounts the container's own
	// cgroups, then the agent's hostPath mount of /sys/fs/cgroup lies over.
	v1 := []*mountinfo.Info{
		{FSType: "cgroup", Root: "/kubepods/besteffort/pod1/abc", Mountpoint: "/sys/fs/cgroup/cpu,cpuacct", VFSOptions: "rw,cpu,cpuacct"},
		{FSType: "cgroup", Root: "/", Mountpoint: "/sys/fs/cgroup/cpu", VFSOptions: "rw,cpu"},
		{FSType: "cgroup", Root: "/", Mountpoint: "/sys/fs/cgroup/cpuacct", VFSOptions: "rw,cpuacct"},
		{FSType: "cgroup2", Root: "/", Mountpoint: "/sys/fs/cgroup/unified", VFSOptions: "rw"},
		// another container's cgroup mount, propagated in through a shared mount
		{FSType: "cgroup", Root: "/", Mountpoint: "/var/lib/kubelet/x/rootfs/sys/fs/cgroup/cpu", VFSOptions: "rw,cpu"},
	}
	none := func(string) ([]byte, error) { return nil, errors.New("no") }
	h, err := detect(v1, none)
	if err != nil || h.Version != 1 || h.CPURoot != "/sys/fs/cgroup/cpu" || h.AcctRoot != "/sys/fs/cgroup/cpuacct" {
		t.Fatalf("%+v %v", h, err)
	}
	joint := []*mountinfo.Info{{FSType: "cgroup", Root: "/", Mountpoint: "/sys/fs/cgroup/cpu,cpuacct", VFSOptions: "rw,cpu,cpuacct"}}
	if h, err := detect(joint, none); err != nil || h.AcctRoot != "" || h.CPURoot != "/sys/fs/cgroup/cpu,cpuacct" {
		t.Fatalf("%+v %v", h, err)
	}
	v2 := []*mountinfo.Info{
		{FSType: "cgroup2", Root: "/kubepods.slice/x", Mountpoint: "/sys/fs/cgroup", VFSOptions: "rw"},
		{FSType: "cgroup2", Root: "/", Mountpoint: "/sys/fs/cgroup", VFSOptions: "rw,nsdelegate,favordynmods"},
	}
	cpu := func(string) ([]byte, error) { return []byte("cpuset cpu io memory pids\n"), nil }
	if h, err := detect(v2, cpu); err != nil || h.Version != 2 || !h.FavorDynMods {
		t.Fatalf("%+v %v", h, err)
	}
	odd := []*mountinfo.Info{{FSType: "cgroup2", Root: "/", Mountpoint: "/host/sys/fs/cgroup", VFSOptions: "rw"}}
	if h, err := detect(odd, cpu); err != nil || h.CPURoot != "/host/sys/fs/cgroup" {
		t.Fatalf("a lone mount elsewhere is still used: %+v %v", h, err)
	}
	if _, err := detect(v2[:1], cpu); err == nil {
		t.Fatal("a container-scoped mount alone must not be used")
	}
}

// TestWitnesses: the witness hierarchies are v1 mounts of a hierarchy's
// root that no slot fd reaches (not cpu, not cpuacct), ranked, and only
// the canonical ones when there are any.
func TestWitnesses(t *testing.T) {
	mounts := []*mountinfo.Info{
		{FSType: "cgroup", Root: "/", Mountpoint: "/sys/fs/cgroup/cpu,cpuacct", VFSOptions: "rw,cpu,cpuacct"},
		{FSType: "cgroup", Root: "/", Mountpoint: "/sys/fs/cgroup/systemd", VFSOptions: "rw,xattr,name=systemd"},
		{FSType: "cgroup", Root: "/", Mountpoint: "/sys/fs/cgroup/memory", VFSOptions: "rw,memory"},
		{FSType: "cgroup", Root: "/kubepods/pod1/abc", Mountpoint: "/sys/fs/cgroup/devices", VFSOptions: "rw,devices"},
		{FSType: "cgroup", Root: "/", Mountpoint: "/sys/fs/cgroup/net_cls,net_prio", VFSOptions: "rw,net_cls,net_prio"},
		{FSType: "cgroup", Root: "/", Mountpoint: "/sys/fs/cgroup/pids", VFSOptions: "rw,pids"},
		{FSType: "cgroup2", Root: "/", Mountpoint: "/sys/fs/cgroup/unified", VFSOptions: "rw"},
		{FSType: "cgroup", Root: "/", Mountpoint: "/var/lib/kubelet/x/rootfs/sys/fs/cgroup/freezer", VFSOptions: "rw,freezer"},
	}
	var got []string
	for _, w := range witnessesIn(canonicalMounts(mounts)) {
		got = append(got, w.Key+"="+w.Root)
	}
	want := "pids=/sys/fs/cgroup/pids memory=/sys/fs/cgroup/memory net_cls=/sys/fs/cgroup/net_cls,net_prio name=systemd=/sys/fs/cgroup/systemd"
	if g := strings.Join(got, " "); g != want {
		t.Fatalf("witnesses %s\nwant %s", g, want)
	}
}
