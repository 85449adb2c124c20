package v2node

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/cpuslot/cpuslot/e2e/cluster"
	"github.com/cpuslot/cpuslot/test/vm"
)

// writeConfig writes the PKI, kubeconfigs and component configs into n.dir
// (the guest reads them there, through the host's root) and returns the
// guest's /etc files: the units and the CNI configuration.
func (n *Node) writeConfig(hostPort int) (map[string]string, error) {
	p, err := cluster.NewPKI(filepath.Join(n.dir, "pki"))
	if err != nil {
		return nil, err
	}
	nodeIP := net.ParseIP(vm.GuestIP)
	certs := []cluster.Cert{
		{Name: "apiserver", CN: "kube-apiserver", Server: true,
			DNS: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost", NodeName},
			IPs: []net.IP{nodeIP, net.IPv4(127, 0, 0, 1), net.ParseIP(serviceIP)}},
		{Name: "apiserver-kubelet-client", CN: "kube-apiserver-kubelet-client", Orgs: []string{"system:masters"}, Client: true},
		{Name: "admin", CN: "cpuslot-e2e-admin", Orgs: []string{"system:masters"}, Client: true},
		{Name: "controller-manager", CN: "system:kube-controller-manager", Client: true},
		{Name: "scheduler", CN: "system:kube-scheduler", Client: true},
		{Name: "kubelet-client", CN: "system:node:" + NodeName, Orgs: []string{"system:nodes"}, Client: true},
		// The API server verifies it when it proxies logs and exec.
		{Name: "kubelet", CN: NodeName, DNS: []string{NodeName}, IPs: []net.IP{nodeIP}, Server: true},
	}
	for _, c := range certs {
		if err := p.Issue(c); err != nil {
			return nil, err
		}
	}
	if err := p.ServiceAccountKey(); err != nil {
		return nil, err
	}
	// Every file must be readable through 9p; keys too (the guest is root,
	// qemu reads as the test's user, root).
	kubeconfig := func(name, cert, server string) (string, error) {
		kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: v2node
  cluster:
    certificate-authority: %s
    server: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: v2node
  context:
    cluster: v2node
    user: %s
current-context: v2node
`, p.Path("ca.crt"), server, cert, p.Path(cert+".crt"), p.Path(cert+".key"), cert)
		path := filepath.Join(n.dir, name+".kubeconfig")
		return path, os.WriteFile(path, []byte(kc), 0o600)
	}
	guestAPI := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	hostAPI := fmt.Sprintf("https://127.0.0.1:%d", hostPort)
	kc := map[string]string{}
	for _, c := range []string{"admin", "kubelet-client"} {
		if kc[c], err = kubeconfig(c, c, guestAPI); err != nil {
			return nil, err
		}
	}
	for _, c := range []string{"controller-manager", "scheduler"} {
		if kc[c], err = kubeconfig(c, c, hostAPI); err != nil {
			return nil, err
		}
	}
	if n.kubeconfig, err = kubeconfig("host-admin", "admin", hostAPI); err != nil {
		return nil, err
	}

	containerdConfig := filepath.Join(n.dir, "containerd.toml")
	if err := os.WriteFile(containerdConfig, []byte(fmt.Sprintf(`version = 3
root = %q
state = "/run/containerd"

[grpc]
  address = %q

# NRI is on by default in containerd 2; said here so that the node the
# agent is tested on cannot lose it to a changed default.
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q]
    conf_dir = "/etc/cni/net.d"
`, stateDir+"/containerd", ContainerdSocket, NRISocket, cluster.PauseImage, n.bins.runc, n.bins.cni)), 0o644); err != nil {
		return nil, err
	}

	kubeletConfig := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(kubeletConfig, []byte(cluster.KubeletConfig{
		CgroupDriver: "systemd", RuntimeSocket: ContainerdSocket,
		CertFile: p.Path("kubelet.crt"), KeyFile: p.Path("kubelet.key"), ClientCAFile: p.Path("ca.crt"),
		MaxPods: 30,
	}.YAML()), 0o644); err != nil {
		return nil, err
	}

	k := func(b string) string { return filepath.Join(n.bins.kube, b) }
	unit := func(desc, after, exec string, extra ...string) string {
		return fmt.Sprintf(`[Unit]
Description=%s
DefaultDependencies=no
After=cpuslot-vm-net.service %s

[Service]
ExecStart=%s
Restart=always
RestartSec=2
StandardOutput=append:%s/%%N.log
StandardError=inherit
%s
`, desc, after, exec, logDir, strings.Join(extra, "\n"))
	}
	args := func(a ...string) string { return strings.Join(a, " \\\n\t") }
	etc := map[string]string{
		"systemd/system/" + target: `[Unit]
Description=cpuslot v2 node: control plane, containerd, kubelet
AllowIsolate=yes
Wants=` + strings.Join(Units, " ") + "\n",
		"systemd/system/v2node-etcd.service": unit("etcd", "", args(n.bins.etcd,
			"--name=v2node", "--data-dir="+stateDir+"/etcd",
			"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
			"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
			"--initial-cluster=v2node=http://127.0.0.1:2380", "--log-level=warn")),
		"systemd/system/v2node-apiserver.service": unit("kube-apiserver", "v2node-etcd.service", args(k("kube-apiserver"),
			"--advertise-address="+vm.GuestIP, "--bind-address=0.0.0.0", fmt.Sprintf("--secure-port=%d", apiPort),
			"--etcd-servers=http://127.0.0.1:2379", "--cert-dir="+stateDir+"/apiserver",
			"--client-ca-file="+p.Path("ca.crt"),
			"--tls-cert-file="+p.Path("apiserver.crt"), "--tls-private-key-file="+p.Path("apiserver.key"),
			"--kubelet-client-certificate="+p.Path("apiserver-kubelet-client.crt"),
			"--kubelet-client-key="+p.Path("apiserver-kubelet-client.key"),
			"--kubelet-certificate-authority="+p.Path("ca.crt"),
			"--kubelet-preferred-address-types=InternalIP",
			"--service-account-key-file="+p.Path("sa.pub"), "--service-account-signing-key-file="+p.Path("sa.key"),
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-cluster-ip-range="+serviceCIDR,
			"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
			"--allow-privileged=true", "--profiling=false", "--event-ttl=1h")),
		// As containerd's own unit: the shims keep running when containerd
		// restarts, and containers' scopes are delegated.
		"systemd/system/containerd.service": unit("containerd "+ContainerdVersion, "", args(filepath.Join(n.bins.containerd, "containerd"),
			"--config="+containerdConfig),
			"Environment=PATH="+n.bins.containerd+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"Delegate=yes", "KillMode=process", "OOMScoreAdjust=-999", "LimitNOFILE=infinity", "TasksMax=infinity"),
		"systemd/system/kubelet.service": unit("kubelet "+KubernetesVersion, "containerd.service", args(k("kubelet"),
			"--config="+kubeletConfig, "--kubeconfig="+kc["kubelet-client"],
			"--node-ip="+vm.GuestIP, "--hostname-override="+NodeName, "--v=1")),
		// Pod network: a veth per pod with a host route (ptp), no bridge.
		"cni/net.d/10-v2node.conflist": fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "v2node",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}
    },
    {"type": "loopback"}
  ]
}
`, podCIDR, stateDir+"/cni"),
	}
	// The controller manager and the scheduler run on the host (hostControlPlane):
	// they only talk to the API server, and in the emulated guest they took a
	// fifth of its CPU. No serving port: the legacy node's own run beside them
	// on the host, and nothing here scrapes them.
	n.control = map[string][]string{
		"kube-controller-manager": {k("kube-controller-manager"),
			"--kubeconfig=" + kc["controller-manager"], "--secure-port=0", "--leader-elect=false",
			"--use-service-account-credentials=true", "--service-account-private-key-file=" + p.Path("sa.key"),
			"--root-ca-file=" + p.Path("ca.crt"), "--cluster-signing-cert-file=" + p.Path("ca.crt"),
			"--cluster-signing-key-file=" + p.Path("ca.key"), "--service-cluster-ip-range=" + serviceCIDR,
			"--allocate-node-cidrs=false", "--profiling=false"},
		"kube-scheduler": {k("kube-scheduler"),
			"--kubeconfig=" + kc["scheduler"], "--secure-port=0", "--leader-elect=false", "--profiling=false"},
	}
	return etc, nil
}
