// Package v2node runs a current Kubernetes node: cgroup v2 mounted by
// systemd as PID 1, the systemd cgroup driver, containerd 2 and a current
// runc, and the newest kubelet the Go module proxy serves. The development
// machines bind the cpu controller to cgroup v1, so the node is a qemu guest
// (test/vm System) booting the host's own Debian userland read-only with a
// tmpfs overlay. etcd and kube-apiserver run in the guest too, as systemd
// units beside containerd and the kubelet (the API server reaches the
// kubelet and the pod network there); the host reaches the API server
// through one forwarded loopback port, and so do kube-controller-manager and
// kube-scheduler, which run on the host (hostControlPlane): they talk to the
// API server only, and emulated they took a fifth of the guest's CPU. See
// e2e/README.md for why.
//
// Binaries come from hack/v2node-deps.sh (cached by version); images from
// `make images`.
package v2node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
	"github.com/cpuslot/cpuslot/test/vm"
)

// The versions hack/v2node-deps.sh builds (kept equal by a test).
const (
	KubernetesVersion = "v1.37.2"
	ContainerdVersion = "v2.4.2"
	RuncVersion       = "v1.5.2"
)

const (
	// NodeName is the node's name in the API.
	NodeName = "v2node"
	// ContainerdSocket is containerd's socket in the guest (the default
	// path, as on any node).
	ContainerdSocket = "/run/containerd/containerd.sock"
	// NRISocket is containerd's NRI socket in the guest (NRI's default,
	// which the chart's nri.socket defaults to): the agent serves runtime
	// pods as an NRI plugin at their container's start.
	NRISocket   = "/var/run/nri/nri.sock"
	podCIDR     = "10.244.0.0/24"
	serviceCIDR = "10.97.0.0/24"
	serviceIP   = "10.97.0.1"
	apiPort     = 6443
	// PrometheusPort is forwarded from the host for a Prometheus a test
	// runs in the guest (where pod IPs are routed).
	PrometheusPort = 9090
	target         = "v2node.target"
	// stateDir holds etcd's and containerd's data in the guest, on a tmpfs
	// of its own (overlayfs snapshots cannot sit on the root overlay).
	stateDir = "/var/lib/v2node"
	// logDir holds the units' logs, on a tmpfs too: systemd opens
	// StandardOutput=append: before it would make a LogsDirectory=.
	logDir = "/var/log/v2node"
)

// Units are the guest's systemd units of the node, in start order.
var Units = []string{"v2node-etcd.service", "v2node-apiserver.service", "containerd.service", "kubelet.service"}

// Options for Up.
type Options struct {
	// RepoDir is the cpuslot checkout; default: found from the working
	// directory upwards.
	RepoDir string
	// CacheDir: $CPUSLOT_E2E_CACHE, default <repo>/.cache/e2e.
	CacheDir string
	// Logf receives progress; default: discarded.
	Logf func(format string, args ...any)
	// Console, if set, receives the guest's serial console.
	Console io.Writer
	// BootTimeout bounds the boot up to systemd's control shell;
	// ReadyTimeout the rest, up to node Ready, the images imported and the
	// default service account (defaults: 10 and 20 minutes: the node is
	// emulated, and CI machines are loaded).
	BootTimeout, ReadyTimeout time.Duration
}

// Node is a running v2 node with its control plane.
type Node struct {
	opts       Options
	sys        *vm.System
	dir        string
	kubeconfig string
	kubectl    string
	bins       binaries
	// promHostPort is the host's end of PrometheusPort.
	promHostPort int
	// control: the host's control-plane commands (name -> argv), and
	// stopControl ends them.
	control     map[string][]string
	stopControl func()
	// Boot is the time from starting qemu to systemd's control shell;
	// Ready the time from starting qemu to the node's Ready condition.
	Boot, Ready time.Duration
}

type binaries struct {
	kube, containerd, runc, etcd, cni string
	images                            map[string]string // image name -> tarball
}

// Up boots the node and returns when it is Ready, the images are imported
// and the default service account exists. On error everything is torn down.
func Up(ctx context.Context, opts Options) (_ *Node, err error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.BootTimeout == 0 {
		opts.BootTimeout = 10 * time.Minute
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 20 * time.Minute
	}
	bins, err := findBinaries(&opts)
	if err != nil {
		return nil, err
	}
	if err := vm.SystemAvailable(); err != nil {
		return nil, err
	}
	n := &Node{opts: opts, bins: bins}
	n.kubectl, err = exec.LookPath("kubectl")
	if err != nil {
		n.kubectl = filepath.Join(bins.kube, "kubectl")
	}
	n.dir, err = os.MkdirTemp("", "cpuslot-v2node-")
	if err != nil {
		return nil, err
	}
	// The guest reads this directory through the host's root (9p, as
	// root: qemu runs as the test's user).
	if err := os.Chmod(n.dir, 0o755); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.Down()
		}
	}()
	hostPort, err := freePort()
	if err != nil {
		return nil, err
	}
	for n.promHostPort == 0 || n.promHostPort == hostPort {
		if n.promHostPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	etc, err := n.writeConfig(hostPort)
	if err != nil {
		return nil, err
	}

	bootCtx, cancel := context.WithTimeout(ctx, opts.BootTimeout)
	defer cancel()
	opts.Logf("v2node: booting the guest (systemd, %s)", target)
	n.sys, err = vm.BootSystem(bootCtx, vm.SystemOptions{
		Target:   target,
		Etc:      etc,
		Tmpfs:    []string{stateDir, logDir, "/var/lib/kubelet"},
		Forward:  map[int]int{hostPort: apiPort, n.promHostPort: PrometheusPort},
		MemoryMB: 3072,
		Console:  opts.Console,
	}, opts.Logf)
	if err != nil {
		return nil, err
	}
	n.Boot = n.sys.Uptime()
	opts.Logf("v2node: systemd up, control shell ready after %v", n.Boot.Round(time.Second))
	n.stopControl = n.hostControlPlane()

	readyCtx, cancel2 := context.WithTimeout(ctx, opts.ReadyTimeout)
	defer cancel2()
	if err := n.importImages(readyCtx); err != nil {
		return nil, n.withDiagnosis(err)
	}
	if err := n.waitNodeReady(readyCtx); err != nil {
		return nil, n.withDiagnosis(err)
	}
	n.Ready = n.sys.Uptime()
	opts.Logf("v2node: node Ready after %v", n.Ready.Round(time.Second))
	if err := n.poll(readyCtx, "the default service account", func() error {
		_, err := n.Kubectl(readyCtx, "get", "serviceaccount", "default", "-n", "default")
		return err
	}); err != nil {
		return nil, n.withDiagnosis(err)
	}
	return n, nil
}

// Down stops the guest and removes the node's host directory. The guest's
// state lived in its tmpfs: nothing else is left on the host.
func (n *Node) Down() {
	if n == nil {
		return
	}
	if n.stopControl != nil {
		n.stopControl()
	}
	if n.sys != nil {
		n.sys.Stop()
	}
	if n.dir != "" {
		os.RemoveAll(n.dir)
	}
}

// Kubeconfig is the host-side admin kubeconfig (API server on a forwarded
// 127.0.0.1 port).
func (n *Node) Kubeconfig() string { return n.kubeconfig }

// PrometheusURL is the host's URL of the guest's PrometheusPort.
func (n *Node) PrometheusURL() string { return fmt.Sprintf("http://127.0.0.1:%d", n.promHostPort) }

// Kubectl runs kubectl on the host against the node's API server. A
// command that could not reach the API server at all (the emulated API
// server times out TLS handshakes when the machine is loaded) is tried
// again, twice; any other failure is returned as it is.
func (n *Node) Kubectl(ctx context.Context, args ...string) (string, error) {
	var out, all string
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			time.Sleep(2 * time.Second)
		}
		cmd := exec.CommandContext(ctx, n.kubectl, append([]string{"--kubeconfig", n.kubeconfig}, args...)...)
		out, all, err = cluster.RunKubectl(cmd)
		if err == nil || ctx.Err() != nil || !unreached(all) {
			break
		}
	}
	if err != nil {
		return all, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(all))
	}
	return out, nil
}

// unreached reports whether kubectl's output says its request never got to
// act on the API server, so that the command can be tried again whatever
// it does: the emulated API server, loaded, answers late or not at all
// (an apply's client-side validation downloads the OpenAPI schema first).
func unreached(out string) bool {
	for _, s := range []string{"Unable to connect to the server", "failed to download openapi", "TLS handshake timeout"} {
		if strings.Contains(out, s) {
			return true
		}
	}
	return false
}

// Exec runs a bash script as root in the guest (see vm.System.Exec).
func (n *Node) Exec(ctx context.Context, script string) (string, int, error) {
	return n.sys.Exec(ctx, script)
}

// MustExec is Exec with a non-zero exit code as an error.
func (n *Node) MustExec(ctx context.Context, script string) (string, error) {
	out, code, err := n.sys.Exec(ctx, script)
	if err == nil && code != 0 {
		err = fmt.Errorf("guest: %q exited %d: %s", script, code, strings.TrimSpace(out))
	}
	return out, err
}

// Diagnose returns the state of the node's units and the tail of their
// logs, for a failure message.
func (n *Node) Diagnose(ctx context.Context) string {
	if n.sys == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	out, _, err := n.sys.Exec(ctx, "systemctl --no-pager list-units --all 'v2node-*' containerd.service kubelet.service; "+
		"for f in "+logDir+"/*.log; do echo \"== $f\"; tail -n 15 \"$f\"; done; free -m; uptime")
	if err != nil {
		out = fmt.Sprintf("(no diagnosis from the guest: %v)\n", err)
	}
	return out + n.controlLogs(15, 0)
}

// progress is a short account of the node's units for a slow wait: their
// states and each log's last line.
func (n *Node) progress(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, _, err := n.sys.Exec(ctx, "for u in "+strings.Join(Units, " ")+"; do "+
		"echo \"$u: $(systemctl is-active $u) | $(tail -n 1 "+logDir+"/${u%.service}.log | cut -c1-300)\"; done")
	if err != nil {
		out = fmt.Sprintf("(guest: %v)", err)
	}
	return strings.TrimSpace(out) + "\n" + strings.TrimSpace(n.controlLogs(1, 300))
}

func (n *Node) withDiagnosis(err error) error {
	return fmt.Errorf("%w\nguest state:\n%s", err, n.Diagnose(context.Background()))
}

// poll calls f every 2 s until it succeeds or ctx ends; the error then
// names what was awaited and f's last error.
func (n *Node) poll(ctx context.Context, what string, f func() error) error {
	start := time.Now()
	last := time.Now()
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Since(last) > time.Minute {
			n.opts.Logf("v2node: still waiting for %s after %v: %v\n%s", what, time.Since(start).Round(time.Second), err, n.progress(ctx))
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("v2node: waiting for %s: %w after %v; last: %v", what, ctx.Err(), time.Since(start).Round(time.Second), err)
		case <-n.sys.Done():
			return fmt.Errorf("v2node: waiting for %s: the guest stopped; console:\n%s", what, n.sys.ConsoleTail(40))
		case <-time.After(2 * time.Second):
		}
	}
}

func (n *Node) importImages(ctx context.Context) error {
	var script strings.Builder
	// containerd answers within seconds of the boot on a quiet machine;
	// five minutes is for a loaded one, then the script says why not.
	fmt.Fprintf(&script, `set -e
ctr=%[1]s
for i in $(seq 300); do $ctr -a %[2]s version >/dev/null 2>&1 && break; sleep 1; done
$ctr -a %[2]s version >/dev/null || { systemctl --no-pager status containerd.service; tail -n 30 %[3]s/containerd.log; exit 1; }
`, filepath.Join(n.bins.containerd, "ctr"), ContainerdSocket, logDir)
	for name, tar := range n.bins.images {
		fmt.Fprintf(&script, "$ctr -a %s -n k8s.io images import %s >/dev/null\n", ContainerdSocket, tar)
		fmt.Fprintf(&script, "$ctr -a %s -n k8s.io images ls -q | grep -qx %s\n", ContainerdSocket, name)
	}
	start := time.Now()
	if _, err := n.MustExec(ctx, script.String()); err != nil {
		return fmt.Errorf("v2node: importing images: %w", err)
	}
	n.opts.Logf("v2node: %d images imported in %v", len(n.bins.images), time.Since(start).Round(time.Second))
	return nil
}

// ImportImage imports an OCI image tarball (a host path) into the node's
// containerd, for the kubelet (namespace k8s.io).
//
// ctr waits on containerd without a deadline, and once in CI an import of
// the agent's 55 MB image did not end for the test's whole budget (55 min)
// with nothing on the console to say why. So each try is bounded in the
// guest (importTry); one that does not end dumps containerd's goroutines to
// its log, shows the node's state, restarts containerd and tries once more.
// The whole call is bounded on the host too, so that a guest that stops
// answering fails here, with what the host sees of it (vm.System.hostView).
func (n *Node) ImportImage(ctx context.Context, tar string) error {
	if _, err := os.Stat(tar); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*importTry+5*time.Minute)
	defer cancel()
	ctr := fmt.Sprintf("%s -a %s", filepath.Join(n.bins.containerd, "ctr"), ContainerdSocket)
	script := fmt.Sprintf(`for try in 1 2; do
  timeout %[4]d %[1]s -n k8s.io images import %[2]q >/dev/null && { [ $try = 1 ] || echo "import: try 2 passed"; exit 0; }
  echo "import: try $try exited $? (124: it ran %[4]d s)"
  pkill -USR1 -x containerd && sleep 2
  echo "== containerd.log (with its goroutines)"; tail -n 150 %[3]s/containerd.log
  free -m; uptime; ps -eo pid,stat,etime,time,rss,args --sort=-time | head -25
  [ $try = 2 ] && exit 1
  systemctl restart containerd.service
  for i in $(seq 120); do %[1]s version >/dev/null 2>&1 && break; sleep 1; done
done`, ctr, tar, logDir, int(importTry/time.Second))
	out, err := n.MustExec(ctx, script)
	if err != nil {
		return fmt.Errorf("v2node: importing %s: %w", filepath.Base(tar), err)
	}
	if out = strings.TrimSpace(out); out != "" {
		// Passed on the second try: say why the first did not.
		n.opts.Logf("v2node: importing %s: the first try did not end:\n%s", filepath.Base(tar), out)
	}
	return nil
}

// importTry bounds one ctr import in the guest: seconds on a quiet node,
// a minute or two on a loaded emulated one.
const importTry = 10 * time.Minute

// RepoDir is the cpuslot checkout the node was built from.
func (n *Node) RepoDir() string { return n.opts.RepoDir }

func (n *Node) waitNodeReady(ctx context.Context) error {
	return n.poll(ctx, "node "+NodeName+" Ready", func() error {
		out, err := n.Kubectl(ctx, "get", "node", NodeName, "-o",
			`jsonpath={range .status.conditions[?(@.type=="Ready")]}{.status} {.message}{end}`)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(out, "True") {
			return fmt.Errorf("Ready: %s", out)
		}
		return nil
	})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// findBinaries checks that hack/v2node-deps.sh and `make images` have run.
func findBinaries(opts *Options) (binaries, error) {
	if opts.RepoDir == "" {
		root, err := repoRoot()
		if err != nil {
			return binaries{}, err
		}
		opts.RepoDir = root
	}
	if opts.CacheDir == "" {
		opts.CacheDir = os.Getenv("CPUSLOT_E2E_CACHE")
	}
	if opts.CacheDir == "" {
		opts.CacheDir = filepath.Join(opts.RepoDir, ".cache", "e2e")
	}
	c := opts.CacheDir
	b := binaries{
		kube:       filepath.Join(c, "k8s", KubernetesVersion, "bin"),
		containerd: filepath.Join(c, "containerd", ContainerdVersion, "bin"),
		runc:       filepath.Join(c, "runc", RuncVersion, "bin", "runc"),
		etcd:       "/usr/bin/etcd",
		cni:        "/usr/lib/cni",
		images: map[string]string{
			cluster.PauseImage: filepath.Join(opts.RepoDir, "bin", "images", "pause.tar"),
			cluster.ProbeImage: filepath.Join(opts.RepoDir, "bin", "images", "probe.tar"),
		},
	}
	var missing []string
	for _, f := range []string{
		filepath.Join(b.kube, "kube-apiserver"), filepath.Join(b.kube, "kube-controller-manager"),
		filepath.Join(b.kube, "kube-scheduler"), filepath.Join(b.kube, "kubelet"),
		filepath.Join(b.containerd, "containerd"), filepath.Join(b.containerd, "containerd-shim-runc-v2"),
		filepath.Join(b.containerd, "ctr"), b.runc, b.etcd,
		filepath.Join(b.cni, "ptp"), filepath.Join(b.cni, "host-local"), filepath.Join(b.cni, "loopback"),
	} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("v2node: missing %s; run hack/v2node-deps.sh (as root)", strings.Join(missing, ", "))
	}
	for _, tar := range b.images {
		if _, err := os.Stat(tar); err != nil {
			return b, fmt.Errorf("v2node: missing %s; run make images", tar)
		}
	}
	return b, nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			strings.HasPrefix(string(data), "module github.com/cpuslot/cpuslot\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("v2node: cannot find the cpuslot checkout (set Options.RepoDir)")
		}
		dir = parent
	}
}
