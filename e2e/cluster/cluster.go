// Package cluster brings up a real single-node Kubernetes on this machine
// from real parts and takes it down again, leaving the machine as it was:
//
//   - containerd, runc and the CNI plugins (bridge, host-local, loopback)
//     from Debian's packages, containerd with its own root, state, socket
//     and runc root under the run dir;
//   - etcd (Debian's), kube-apiserver, kube-controller-manager,
//     kube-scheduler, kubelet and kube-proxy (built from the Go module proxy
//     by hack/e2e-deps.sh), each a child process with its log in LogDir;
//   - a CA and certificates made here; images imported from OCI tarballs
//     (make images), no registry.
//
// Up records the machine's state first (Snapshot, kept in the run dir so a
// crashed run's leftovers are undone at the next Up); Down stops exactly the
// processes Up started, removes pods, containers, mounts, the CNI bridge,
// the kubelet's iptables chains, sysctls, cgroups and directories, and
// returns an error listing whatever still differs from the snapshot.
//
// Needs root, a cgroup v1 or v2 host, and the node's non-loopback IPv4
// address (found at run time).
package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The legacy node's versions: the newest Kubernetes the module proxy
// serves that still runs on cgroup v1 (with failCgroupV1: false), and the
// containerd 2 and runc it needs (since 1.37 the kubelet takes the cgroup
// driver from the runtime's RuntimeConfig, which containerd 1.x lacks).
// The same builds as the v2 node's (hack/v2node-deps.sh, e2e/v2node).
const (
	KubernetesVersion = "v1.37.2"
	ContainerdVersion = "v2.4.2"
	RuncVersion       = "v1.5.2"
)

// DefaultRunDir holds one cluster's state (certificates, etcd data,
// containerd's root, pidfiles, the snapshot). A fixed path on purpose: the
// next Up finds a crashed run's leftovers there, whichever checkout ran it.
const DefaultRunDir = "/var/lib/cpuslot-e2e"

// lockPath serialises clusters on this machine (one at a time fits).
const lockPath = "/run/cpuslot-e2e.lock"

// Options configure Up. Zero values take the defaults described.
type Options struct {
	// RepoDir is the cpuslot checkout; default: found from the working
	// directory upwards.
	RepoDir string
	// CacheDir: $CPUSLOT_E2E_CACHE, default <repo>/.cache/e2e.
	CacheDir string
	// KubeBinDir holds kube-apiserver, kubelet, ...; default
	// <cache>/k8s/<KubernetesVersion>/bin.
	KubeBinDir string
	// Kubectl: default the kubectl in PATH, else <KubeBinDir>/kubectl.
	Kubectl string
	// ContainerdBinDir holds containerd, containerd-shim-runc-v2 and ctr;
	// default <cache>/containerd/<ContainerdVersion>/bin.
	ContainerdBinDir string
	// Runc: default <cache>/runc/<RuncVersion>/bin/runc.
	Runc string
	// RunDir: default DefaultRunDir. Removed by Down.
	RunDir string
	// LogDir receives each component's log; default <cache>/logs. Its
	// previous content is removed at Up; it is kept after Down.
	LogDir string
	// Images are OCI image tarballs imported at Up. Default: every
	// <repo>/bin/images/*.tar. The pause image (PauseImage) must be among
	// them.
	Images []string
	// NodeIP: default the IPv4 address of the interface with the default
	// route (or the first global one).
	NodeIP string
	// NodeName: default the host name, lower-cased.
	NodeName string
	// NoKubeProxy leaves kube-proxy out (no ClusterIP services then).
	NoKubeProxy bool
	// LockWait is how long Up waits for another cluster on this machine to
	// go down; default 5 minutes.
	LockWait time.Duration
	// Logf receives progress lines; default discards them.
	Logf func(format string, args ...any)
}

// Cluster is a running single-node cluster.
type Cluster struct {
	opts       Options
	runDir     string
	logDir     string
	binDir     string
	kubectl    string
	nodeIP     string
	nodeName   string
	pki        *pki
	kubeconfig string
	api        *apiClient
	snap       *Snapshot
	lock       *os.File

	mu    sync.Mutex
	procs []*proc

	downOnce sync.Once
	downErr  error

	// Timings of Up's phases, for the test log.
	Timings []Timing
}

// Timing is one measured phase.
type Timing struct {
	Phase    string
	Duration time.Duration
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

func (c *Cluster) mark(phase string, since time.Time) {
	d := time.Since(since)
	c.Timings = append(c.Timings, Timing{phase, d})
	c.logf("cluster: %s in %v", phase, d.Round(time.Millisecond))
}

// Kubeconfig is the path of an admin (system:masters) kubeconfig.
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// NodeIP is the node's address (API server, kubelet).
func (c *Cluster) NodeIP() string { return c.nodeIP }

// NodeName is the name the node registered under.
func (c *Cluster) NodeName() string { return c.nodeName }

// ContainerdSocket is the path of the cluster's containerd socket (not the
// default /run/containerd/containerd.sock: the cluster's containerd is its
// own).
func (c *Cluster) ContainerdSocket() string { return c.containerdSockPath() }

// KubectlPath is the kubectl binary the cluster uses.
func (c *Cluster) KubectlPath() string { return c.kubectl }

// LogDir is where the components' logs are.
func (c *Cluster) LogDir() string { return c.logDir }

// CACert is the path of the cluster CA's certificate.
func (c *Cluster) CACert() string { return c.pki.path("ca.crt") }

// Snapshot is the machine's state recorded before Up.
func (c *Cluster) Snapshot() *Snapshot { return c.snap }

// acquireLock takes the machine-wide cluster lock, waiting up to wait.
func acquireLock(wait time.Duration, logf func(string, ...any)) (*os.File, error) {
	deadline := time.Now().Add(wait)
	logged := false
	for {
		f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			// The holder before us may have removed the file after we
			// opened it: the lock must be on the file at the path.
			var st1, st2 syscall.Stat_t
			if syscall.Fstat(int(f.Fd()), &st1) == nil && syscall.Stat(lockPath, &st2) == nil && st1.Ino == st2.Ino {
				fmt.Fprintf(f, "%d\n", os.Getpid())
				return f, nil
			}
		}
		f.Close()
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("another e2e cluster holds %s (pid %s) after %v", lockPath, strings.TrimSpace(readFile(lockPath)), wait)
		}
		if !logged {
			logf("cluster: waiting for another e2e cluster on this machine (%s)", lockPath)
			logged = true
		}
		time.Sleep(time.Second)
	}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// Up brings the cluster up and returns when the node is Ready, the images
// are imported and the default service account exists. On failure it
// tears down what it started and returns the error with the failing
// component's log tail.
func Up(ctx context.Context, opts Options) (*Cluster, error) {
	if err := opts.Defaults(); err != nil {
		return nil, err
	}
	if err := opts.CheckDeps(); err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, runDir: opts.RunDir, logDir: opts.LogDir, binDir: opts.KubeBinDir, kubectl: opts.Kubectl}
	lock, err := acquireLock(opts.LockWait, c.logf)
	if err != nil {
		return nil, err
	}
	c.lock = lock
	if err := c.cleanStale(); err != nil {
		c.releaseLock()
		return nil, err
	}
	track(c, true)
	if err := c.up(ctx); err != nil {
		if derr := c.Down(); derr != nil {
			err = fmt.Errorf("%w; teardown after the failure: %v", err, derr)
		}
		return nil, err
	}
	return c, nil
}

var (
	activeMu sync.Mutex
	active   = map[*Cluster]bool{}
)

func track(c *Cluster, on bool) {
	activeMu.Lock()
	defer activeMu.Unlock()
	if on {
		active[c] = true
	} else {
		delete(active, c)
	}
}

// DownAll takes down every cluster of this process that is still up (for
// signal handlers).
func DownAll() error {
	activeMu.Lock()
	var cs []*Cluster
	for c := range active {
		cs = append(cs, c)
	}
	activeMu.Unlock()
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Down())
	}
	return errors.Join(errs...)
}

func (c *Cluster) up(ctx context.Context) error {
	t0 := time.Now()
	if err := os.MkdirAll(filepath.Join(c.runDir, "pids"), 0o700); err != nil {
		return err
	}
	// The snapshot first, so that whatever happens next can be undone.
	c.snap = TakeSnapshot()
	c.snap.RunDir = c.runDir
	if err := c.snap.save(filepath.Join(c.runDir, "state.json")); err != nil {
		return err
	}
	os.RemoveAll(c.logDir)
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return err
	}

	c.nodeIP = c.opts.NodeIP
	if c.nodeIP == "" {
		ip, err := DiscoverNodeIP()
		if err != nil {
			return err
		}
		c.nodeIP = ip
	}
	if err := checkNoOverlap(c.nodeIP); err != nil {
		return err
	}
	c.nodeName = c.opts.NodeName
	if c.nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return err
		}
		c.nodeName = strings.ToLower(strings.Split(h, ".")[0])
	}
	c.logf("cluster: node %s at %s, run dir %s, logs %s", c.nodeName, c.nodeIP, c.runDir, c.logDir)

	if err := c.writePKI(); err != nil {
		return err
	}
	// Shared mount propagation for what pods mount with HostToContainer
	// (the agent: containerd's directory, the kubelet's pod directory).
	for _, d := range []string{c.runDir, "/var/lib/kubelet"} {
		made, err := ensureSharedMount(d)
		if err != nil {
			return err
		}
		if made {
			c.logf("cluster: %s bind-mounted onto itself as an rshared mount (/ does not propagate mounts here)", d)
		}
	}
	c.mark("snapshot and certificates", t0)

	// containerd and etcd at once; images as soon as containerd answers.
	tStart := time.Now()
	ccfg, err := c.writeContainerdConfig()
	if err != nil {
		return err
	}
	containerd, err := c.start("containerd", []string{c.containerdBin("containerd"), "--config", ccfg},
		// containerd finds its shim on PATH
		[]string{"PATH=" + c.opts.ContainerdBinDir + ":" + os.Getenv("PATH")})
	if err != nil {
		return err
	}
	etcd, err := c.start("etcd", []string{mustLook("etcd"),
		"--name", "e2e",
		"--data-dir", filepath.Join(c.runDir, "etcd"),
		"--listen-client-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdClientPort),
		"--advertise-client-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdClientPort),
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeerPort),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeerPort),
		"--initial-cluster", fmt.Sprintf("e2e=http://127.0.0.1:%d", etcdPeerPort),
		"--logger", "zap",
		"--log-level", "warn",
	}, nil)
	if err != nil {
		return err
	}
	// The pause image first: the kubelet can start once it is there; the
	// others (the Java runtime's is large) are imported meanwhile.
	images := append([]string(nil), c.opts.Images...)
	sort.SliceStable(images, func(i, j int) bool {
		return filepath.Base(images[i]) == "pause.tar" && filepath.Base(images[j]) != "pause.tar"
	})
	pauseImported := make(chan error, 1)
	imported := make(chan error, 1)
	go func() {
		if err := c.waitFor(ctx, containerd, 30*time.Second, "containerd socket", func() error {
			_, err := run(c.containerdBin("ctr"), "-a", c.containerdSockPath(), "version")
			return err
		}); err != nil {
			pauseImported <- err
			imported <- err
			return
		}
		t := time.Now()
		pauseSent := false
		for _, img := range images {
			if err := c.ImportImage(img); err != nil {
				if !pauseSent {
					pauseImported <- err
				}
				imported <- err
				return
			}
			if !pauseSent {
				pauseImported <- nil
				pauseSent = true
			}
		}
		if !pauseSent {
			pauseImported <- nil
		}
		c.mark(fmt.Sprintf("import of %d images", len(images)), t)
		imported <- nil
	}()
	if err := c.waitFor(ctx, etcd, 30*time.Second, "etcd health", func() error {
		return httpOK(fmt.Sprintf("http://127.0.0.1:%d/health", etcdClientPort))
	}); err != nil {
		return err
	}

	apiserver, err := c.start("kube-apiserver", []string{filepath.Join(c.binDir, "kube-apiserver"),
		"--advertise-address", c.nodeIP,
		"--bind-address", "0.0.0.0",
		fmt.Sprintf("--secure-port=%d", APIServerPort),
		"--etcd-servers", fmt.Sprintf("http://127.0.0.1:%d", etcdClientPort),
		"--cert-dir", filepath.Join(c.runDir, "apiserver"),
		"--client-ca-file", c.pki.path("ca.crt"),
		"--tls-cert-file", c.pki.path("apiserver.crt"),
		"--tls-private-key-file", c.pki.path("apiserver.key"),
		"--kubelet-client-certificate", c.pki.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", c.pki.path("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority", c.pki.path("ca.crt"),
		"--kubelet-preferred-address-types", "InternalIP",
		"--service-account-key-file", c.pki.path("sa.pub"),
		"--service-account-signing-key-file", c.pki.path("sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range", serviceCIDR,
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
		"--event-ttl", "1h",
	}, nil)
	if err != nil {
		return err
	}
	c.api, err = newAPIClient(fmt.Sprintf("https://%s:%d", c.nodeIP, APIServerPort), c.pki)
	if err != nil {
		return err
	}
	if err := c.waitFor(ctx, apiserver, 60*time.Second, "API server /readyz", func() error {
		return c.api.get(ctx, "/readyz", nil)
	}); err != nil {
		return err
	}
	c.mark("containerd, etcd and API server ready", tStart)

	tNode := time.Now()
	if err := c.startControlPlane(); err != nil {
		return err
	}
	if err := <-pauseImported; err != nil {
		return err
	}
	kubelet, err := c.startKubelet()
	if err != nil {
		return err
	}
	if err := c.waitFor(ctx, kubelet, 90*time.Second, "node Ready", func() error {
		return c.nodeReady(ctx)
	}); err != nil {
		return err
	}
	c.mark("node Ready after API server ready", tNode)
	if err := <-imported; err != nil {
		return err
	}
	if err := c.waitFor(ctx, nil, 60*time.Second, "default service account and kube-root-ca.crt", func() error {
		return c.NamespaceReady(ctx, "default")
	}); err != nil {
		return err
	}
	c.mark("cluster up", t0)
	return nil
}

// ImportImage imports an OCI image-layout tarball into the cluster's
// containerd (namespace k8s.io, where the kubelet finds images).
func (c *Cluster) ImportImage(tarPath string) error {
	if _, err := run(c.containerdBin("ctr"), "-a", c.containerdSockPath(), "-n", "k8s.io", "images", "import", tarPath); err != nil {
		return fmt.Errorf("import %s: %w", tarPath, err)
	}
	c.logf("cluster: imported %s", filepath.Base(tarPath))
	return nil
}

// Kubectl runs kubectl against the cluster and returns its standard output
// (on failure, both streams).
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.KubectlStdin(ctx, "", args...)
}

// Apply runs kubectl apply -f - with manifest on standard input.
func (c *Cluster) Apply(ctx context.Context, manifest string) (string, error) {
	return c.KubectlStdin(ctx, manifest, "apply", "-f", "-")
}

// KubectlStdin runs kubectl with stdin as its standard input.
func (c *Cluster) KubectlStdin(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, all, err := RunKubectl(cmd)
	if err != nil {
		return all, fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(all))
	}
	return out, nil
}

// RunKubectl runs a kubectl command and returns its standard output, which
// is what callers parse, and both streams as they came, which is what they
// show when it fails: kubectl's standard error carries client-go's log
// lines (the exec websocket's "Unknown stream id 1, discarding message")
// and warnings even when the command succeeds.
func RunKubectl(cmd *exec.Cmd) (stdout, all string, err error) {
	var out bytes.Buffer
	both := &lockedBuffer{}
	cmd.Stdout = io.MultiWriter(&out, both)
	cmd.Stderr = both
	err = cmd.Run()
	return out.String(), both.String(), err
}

// lockedBuffer is written by the copiers of both of a command's streams.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Start runs a helper process for a test (e.g. a Prometheus server) the way
// the components run: its log in LogDir()/<name>.log, a pidfile so that a
// crashed run's copy is stopped at the next Up, and stopped by Down at the
// latest. Give it state under RunDir() (removed by Down). stop ends it
// (SIGTERM, then SIGKILL after 5 s).
func (c *Cluster) Start(name string, argv ...string) (stop func(), err error) {
	if componentNames[name] {
		return nil, fmt.Errorf("start %s: the name of a cluster component", name)
	}
	p, err := c.start(name, argv, nil)
	if err != nil {
		return nil, err
	}
	return func() { p.stop(5 * time.Second) }, nil
}

// RunDir is the cluster's run dir (removed by Down).
func (c *Cluster) RunDir() string { return c.runDir }

func (c *Cluster) releaseLock() {
	if c.lock != nil {
		os.Remove(lockPath)
		c.lock.Close()
		c.lock = nil
	}
}
