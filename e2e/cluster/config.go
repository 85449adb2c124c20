package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

const (
	// bridgeName is the CNI bridge; Down deletes it.
	bridgeName = "cpuslot0"
	// podCIDR and serviceCIDR are private ranges the node's own networks
	// are checked against at Up.
	podCIDR        = "10.244.0.0/16"
	serviceCIDR    = "10.97.0.0/24"
	kubernetesSvc  = "10.97.0.1"
	etcdClientPort = 12379
	etcdPeerPort   = 12380
	// APIServerPort is the API server's secure port on the node IP (and
	// 127.0.0.1).
	APIServerPort = 6443
)

func (c *Cluster) containerdSockPath() string {
	return filepath.Join(c.runDir, "containerd", "containerd.sock")
}

// NRISocket is containerd's NRI socket, which the agent connects to as a
// plugin.
func (c *Cluster) NRISocket() string {
	return filepath.Join(c.runDir, "nri", "nri.sock")
}

func (c *Cluster) writeContainerdConfig() (string, error) {
	d := filepath.Join(c.runDir, "containerd")
	for _, sub := range []string{"root", "state", "opt", "runc"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o711); err != nil {
			return "", err
		}
	}
	cniConf := filepath.Join(c.runDir, "cni", "net.d")
	if err := os.MkdirAll(cniConf, 0o755); err != nil {
		return "", err
	}
	runcPath := c.opts.Runc
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
oom_score = 0
# Snapshotters and plugins the cluster does not use (some probe or load
# kernel modules at start).
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[ttrpc]
  address = ""

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %q

# NRI is on by default; its socket goes under the run directory, not the
# host's /var/run/nri, which another runtime on this host may own.
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = %q
  plugin_path = %q
  plugin_config_path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # This machine's root may lack CAP_SYS_RESOURCE: without this every
  # sandbox fails ("failed to update /proc/self/oom_score_adj").
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  netns_mounts_under_state_dir = true
  max_container_log_line_size = 16384

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = %q
        Root = %q
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
    max_conf_num = 1
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.containerdSockPath(),
		filepath.Join(d, "opt"), c.NRISocket(), filepath.Join(c.runDir, "nri", "plugins"), filepath.Join(c.runDir, "nri", "conf.d"), PauseImage, runcPath, filepath.Join(d, "runc"), cniConf)
	path := filepath.Join(d, "config.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return "", err
	}
	conflist := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "cpuslot-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {"type": "loopback"}
  ]
}
`, bridgeName, podCIDR, filepath.Join(c.runDir, "cni", "ipam"))
	if err := os.WriteFile(filepath.Join(cniConf, "10-cpuslot-e2e.conflist"), []byte(conflist), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// kubeconfig writes a kubeconfig for a client certificate issued by the pki.
func (c *Cluster) writeKubeconfig(name, certName string) (string, error) {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: cpuslot-e2e
  cluster:
    certificate-authority: %s
    server: https://%s:%d
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: cpuslot-e2e
  context:
    cluster: cpuslot-e2e
    user: %s
current-context: cpuslot-e2e
`, c.pki.path("ca.crt"), c.nodeIP, APIServerPort, certName,
		c.pki.path(certName+".crt"), c.pki.path(certName+".key"), certName)
	path := filepath.Join(c.runDir, name+".kubeconfig")
	return path, os.WriteFile(path, []byte(kc), 0o600)
}

func (c *Cluster) writeKubeletConfig() (string, error) {
	d := filepath.Join(c.runDir, "kubelet")
	if err := os.MkdirAll(d, 0o700); err != nil {
		return "", err
	}
	cfg := KubeletConfig{
		CgroupDriver: "cgroupfs", AllowCgroupV1: true,
		RuntimeSocket: c.containerdSockPath(),
		CertFile:      c.pki.path("kubelet.crt"), KeyFile: c.pki.path("kubelet.key"), ClientCAFile: c.pki.path("ca.crt"),
		PodLogsDir: filepath.Join(c.runDir, "pod-logs"), MaxPods: 110,
	}.YAML()
	path := filepath.Join(d, "config.yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

// KubeletConfig holds what differs between the e2e nodes' kubelets; YAML
// writes the configuration they share around it.
type KubeletConfig struct {
	CgroupDriver  string // "cgroupfs" or "systemd"
	AllowCgroupV1 bool   // failCgroupV1: false (the legacy node)
	RuntimeSocket string
	CertFile      string
	KeyFile       string
	ClientCAFile  string
	PodLogsDir    string // "": the kubelet's default
	MaxPods       int
}

func (k KubeletConfig) YAML() string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: %s\n", k.CgroupDriver)
	if k.AllowCgroupV1 {
		b.WriteString("failCgroupV1: false\n")
	}
	fmt.Fprintf(&b, `failSwapOn: false
containerRuntimeEndpoint: unix://%s
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
# Images are imported, not pulled: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 24h
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
  imagefs.inodesFree: "1%%"
evictionPressureTransitionPeriod: 10s
`, k.RuntimeSocket, k.CertFile, k.KeyFile, k.ClientCAFile)
	if k.PodLogsDir != "" {
		fmt.Fprintf(&b, "podLogsDir: %s\n", k.PodLogsDir)
	}
	fmt.Fprintf(&b, `serializeImagePulls: false
maxPods: %d
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
shutdownGracePeriod: 0s
`, k.MaxPods)
	return b.String()
}

func (c *Cluster) writeKubeProxyConfig(kubeconfig string) (string, error) {
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
bindAddress: 0.0.0.0
clusterCIDR: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
iptables:
  localhostNodePorts: false
# Leave the conntrack sysctls alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, c.nodeName, podCIDR)
	path := filepath.Join(c.runDir, "kube-proxy.yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}
