package cluster

// Before Up: the defaults filled in, the dependencies checked, the node's
// address found and its networks checked against the cluster's.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// FindRepo returns the cpuslot checkout containing dir.
func FindRepo(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/cpuslot/cpuslot\n") {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no cpuslot checkout at or above %s", dir)
		}
		d = parent
	}
}

// Defaults fills in the defaults; Up calls it.
func (o *Options) Defaults() error {
	if o.RepoDir == "" {
		wd, _ := os.Getwd()
		r, err := FindRepo(wd)
		if err != nil {
			return err
		}
		o.RepoDir = r
	}
	if o.CacheDir == "" {
		o.CacheDir = os.Getenv("CPUSLOT_E2E_CACHE")
	}
	if o.CacheDir == "" {
		o.CacheDir = filepath.Join(o.RepoDir, ".cache", "e2e")
	}
	if o.KubeBinDir == "" {
		o.KubeBinDir = filepath.Join(o.CacheDir, "k8s", KubernetesVersion, "bin")
	}
	if o.ContainerdBinDir == "" {
		o.ContainerdBinDir = filepath.Join(o.CacheDir, "containerd", ContainerdVersion, "bin")
	}
	if o.Runc == "" {
		o.Runc = filepath.Join(o.CacheDir, "runc", RuncVersion, "bin", "runc")
	}
	if o.Kubectl == "" {
		if p, err := exec.LookPath("kubectl"); err == nil {
			o.Kubectl = p
		} else {
			o.Kubectl = filepath.Join(o.KubeBinDir, "kubectl")
		}
	}
	if o.RunDir == "" {
		o.RunDir = DefaultRunDir
	}
	if o.LogDir == "" {
		o.LogDir = filepath.Join(o.CacheDir, "logs")
	}
	if o.Images == nil {
		imgs, _ := filepath.Glob(filepath.Join(o.RepoDir, "bin", "images", "*.tar"))
		o.Images = imgs
	}
	if o.LockWait == 0 {
		o.LockWait = 5 * time.Minute
	}
	return nil
}

// CheckDeps reports what Up needs and does not find (run hack/e2e-deps.sh
// and make images).
func (o *Options) CheckDeps() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(o.KubeBinDir, b)); err != nil {
			missing = append(missing, filepath.Join(o.KubeBinDir, b))
		}
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		if _, err := os.Stat(filepath.Join(o.ContainerdBinDir, b)); err != nil {
			missing = append(missing, filepath.Join(o.ContainerdBinDir, b))
		}
	}
	if _, err := os.Stat(o.Runc); err != nil {
		missing = append(missing, o.Runc)
	}
	for _, b := range []string{"etcd", "iptables", "ip"} {
		if _, err := lookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	for _, b := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat("/usr/lib/cni/" + b); err != nil {
			missing = append(missing, "/usr/lib/cni/"+b)
		}
	}
	if _, err := os.Stat(o.Kubectl); err != nil {
		missing = append(missing, "kubectl")
	}
	pause := false
	for _, img := range o.Images {
		if filepath.Base(img) == "pause.tar" {
			pause = true
		}
		if _, err := os.Stat(img); err != nil {
			missing = append(missing, img)
		}
	}
	if !pause {
		missing = append(missing, "the pause image tarball (make images)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("e2e cluster: missing %s (run hack/e2e-deps.sh as root and make images)", strings.Join(missing, ", "))
	}
	return nil
}

// lookPath is exec.LookPath that also searches the sbin directories.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

// DiscoverNodeIP returns the IPv4 address of the interface holding the
// default route, else the first global unicast IPv4 address.
func DiscoverNodeIP() (string, error) {
	if b, err := os.ReadFile("/proc/net/route"); err == nil {
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 1 && f[1] == "00000000" {
				if ifi, err := net.InterfaceByName(f[0]); err == nil {
					if ip := firstIPv4(ifi); ip != "" {
						return ip, nil
					}
				}
			}
		}
	}
	ifs, _ := net.Interfaces()
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagLoopback != 0 || ifi.Flags&net.FlagUp == 0 || ifi.Name == bridgeName {
			continue
		}
		if ip := firstIPv4(&ifi); ip != "" {
			return ip, nil
		}
	}
	return "", errors.New("no non-loopback IPv4 address on this machine (the API server and kubelet need one)")
}

func firstIPv4(ifi *net.Interface) string {
	addrs, _ := ifi.Addrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// checkNoOverlap refuses a node whose networks overlap the pod or service
// ranges.
func checkNoOverlap(nodeIP string) error {
	ip := net.ParseIP(nodeIP)
	for _, cidr := range []string{podCIDR, serviceCIDR} {
		_, n, _ := net.ParseCIDR(cidr)
		if n.Contains(ip) {
			return fmt.Errorf("node IP %s is inside the cluster's range %s", nodeIP, cidr)
		}
	}
	return nil
}
