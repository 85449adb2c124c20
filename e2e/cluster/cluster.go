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
	"context"
	"errors"
	"fmt"
	"net"
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

// cleanStale undoes a previous run that ended without Down (killed test,
// crash): stops its processes by pidfile and restores the machine to that
// run's snapshot.
func (c *Cluster) cleanStale() error {
	if _, err := os.Stat(c.runDir); err != nil {
		return nil
	}
	c.logf("cluster: %s exists: cleaning up after a previous run", c.runDir)
	stopStale(c.runDir, c.logf)
	snap, err := loadSnapshot(filepath.Join(c.runDir, "state.json"))
	if err != nil {
		// Died before its snapshot was written: nothing it changed
		// outside the run dir can be known; take the machine as it is.
		c.logf("cluster: previous run left no snapshot (%v); undoing mounts under the run dir only", err)
		snap = TakeSnapshot()
	}
	if snap.RunDir == "" {
		snap.RunDir = c.runDir
	}
	errs := c.restore(snap)
	if err := safeRemoveAll(c.runDir); err != nil {
		errs = append(errs, err)
	}
	if left := snap.Diff(TakeSnapshot()); len(left) > 0 {
		c.logf("cluster: after cleaning up the previous run, still different: %s", strings.Join(left, "; "))
	}
	if len(errs) > 0 {
		return fmt.Errorf("cleaning up a previous run: %w", errors.Join(errs...))
	}
	return nil
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

// containerdBin is the path of one of the cluster's containerd binaries.
func (c *Cluster) containerdBin(name string) string {
	return filepath.Join(c.opts.ContainerdBinDir, name)
}

func mustLook(name string) string {
	p, err := lookPath(name)
	if err != nil {
		return name
	}
	return p
}

func (c *Cluster) writePKI() error {
	p, err := newPKI(filepath.Join(c.runDir, "pki"))
	if err != nil {
		return err
	}
	c.pki = p
	ip := net.ParseIP(c.nodeIP)
	lo := net.ParseIP("127.0.0.1")
	specs := []certSpec{
		{name: "apiserver", cn: "kube-apiserver", server: true,
			dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost", c.nodeName},
			ips: []net.IP{ip, lo, net.ParseIP(kubernetesSvc)}},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}, client: true},
		{name: "admin", cn: "cpuslot-e2e-admin", orgs: []string{"system:masters"}, client: true},
		{name: "controller-manager", cn: "system:kube-controller-manager", client: true},
		{name: "scheduler", cn: "system:kube-scheduler", client: true},
		{name: "kube-proxy", cn: "system:kube-proxy", client: true},
		{name: "kubelet-client", cn: "system:node:" + c.nodeName, orgs: []string{"system:nodes"}, client: true},
		// The API server checks this against the node IP for logs/exec.
		{name: "kubelet", cn: c.nodeName, server: true, dns: []string{c.nodeName, "localhost"}, ips: []net.IP{ip, lo}},
	}
	for _, s := range specs {
		if err := p.issue(s); err != nil {
			return err
		}
	}
	if err := p.serviceAccountKey(); err != nil {
		return err
	}
	for _, n := range []string{"admin", "controller-manager", "scheduler", "kube-proxy", "kubelet-client"} {
		path, err := c.writeKubeconfig(n, n)
		if err != nil {
			return err
		}
		if n == "admin" {
			c.kubeconfig = path
		}
	}
	return nil
}

func (c *Cluster) startControlPlane() error {
	kc := func(n string) string { return filepath.Join(c.runDir, n+".kubeconfig") }
	if _, err := c.start("kube-controller-manager", []string{filepath.Join(c.binDir, "kube-controller-manager"),
		"--kubeconfig", kc("controller-manager"),
		"--authentication-kubeconfig", kc("controller-manager"),
		"--authorization-kubeconfig", kc("controller-manager"),
		"--bind-address", "127.0.0.1",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file", c.pki.path("sa.key"),
		"--root-ca-file", c.pki.path("ca.crt"),
		"--cluster-signing-cert-file", c.pki.path("ca.crt"),
		"--cluster-signing-key-file", c.pki.path("ca.key"),
		"--service-cluster-ip-range", serviceCIDR,
		"--allocate-node-cidrs=false",
		"--profiling=false",
	}, nil); err != nil {
		return err
	}
	if _, err := c.start("kube-scheduler", []string{filepath.Join(c.binDir, "kube-scheduler"),
		"--kubeconfig", kc("scheduler"),
		"--authentication-kubeconfig", kc("scheduler"),
		"--authorization-kubeconfig", kc("scheduler"),
		"--bind-address", "127.0.0.1",
		"--leader-elect=false",
		"--profiling=false",
	}, nil); err != nil {
		return err
	}
	if !c.opts.NoKubeProxy {
		cfg, err := c.writeKubeProxyConfig(kc("kube-proxy"))
		if err != nil {
			return err
		}
		if _, err := c.start("kube-proxy", []string{filepath.Join(c.binDir, "kube-proxy"), "--config", cfg}, nil); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startKubelet() (*proc, error) {
	cfg, err := c.writeKubeletConfig()
	if err != nil {
		return nil, err
	}
	return c.start("kubelet", []string{filepath.Join(c.binDir, "kubelet"),
		"--config", cfg,
		"--kubeconfig", filepath.Join(c.runDir, "kubelet-client.kubeconfig"),
		"--node-ip", c.nodeIP,
		"--hostname-override", c.nodeName,
		"--v", "1",
	}, nil)
}

// waitFor polls check every 100 ms until it succeeds, p exits, ctx ends or
// timeout passes.
func (c *Cluster) waitFor(ctx context.Context, p *proc, timeout time.Duration, what string, check func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("waiting for %s: %s exited (%v); last lines of %s:\n%s", what, p.name, p.err, p.logPath, p.tail(30))
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("waiting for %s: not after %v: %v", what, timeout, last)
			if p != nil {
				msg += fmt.Sprintf("; last lines of %s:\n%s", p.logPath, p.tail(30))
			}
			return errors.New(msg)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
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

// Kubectl runs kubectl against the cluster and returns its combined output.
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
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Down tears the cluster down and restores the machine; it is safe to
// call more than once (later calls return the first result). The error
// lists what could not be undone and what still differs from the state
// before Up.
func (c *Cluster) Down() error {
	c.downOnce.Do(func() {
		c.downErr = c.down()
		track(c, false)
	})
	return c.downErr
}

func (c *Cluster) down() error {
	t0 := time.Now()
	var errs []error
	// 1. No controller recreates what is deleted next.
	for _, n := range []string{"kube-controller-manager", "kube-scheduler"} {
		if p := c.proc(n); p != nil {
			p.stop(5 * time.Second)
		}
	}
	// 2. Pods deleted through the API while the kubelet runs: it kills
	//    their containers, tears down their network, unmounts their
	//    volumes and removes their cgroups.
	if api, kl := c.proc("kube-apiserver"), c.proc("kubelet"); c.api != nil && api != nil && !api.exited() && kl != nil && !kl.exited() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := c.deleteAllPods(ctx); err != nil {
			c.logf("cluster: deleting pods: %v (going on)", err)
		}
		cancel()
	}
	tPods := time.Since(t0)
	// 3. Processes tests started with Start, then the rest of the
	//    components, the node's first.
	c.mu.Lock()
	procs := append([]*proc(nil), c.procs...)
	c.mu.Unlock()
	for _, p := range procs {
		if !componentNames[p.name] {
			p.stop(5 * time.Second)
		}
	}
	for _, n := range []string{"kube-proxy", "kubelet", "kube-apiserver", "etcd"} {
		if p := c.proc(n); p != nil {
			p.stop(10 * time.Second)
		}
	}
	// 4. Containers left in containerd (kubelet gone before it collected
	//    them), then containerd, then shims that outlived it.
	if p := c.proc("containerd"); p != nil && !p.exited() {
		c.removeContainers()
		p.stop(10 * time.Second)
	}
	killAll(pidsMentioning(c.runDir+"/"), 5*time.Second)
	// 5. The machine.
	if c.snap != nil {
		errs = append(errs, c.restore(c.snap)...)
	}
	if left := pidsMentioning(c.runDir + "/"); len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes still running from the run dir: %v", left))
	}
	if err := safeRemoveAll(c.runDir); err != nil {
		errs = append(errs, err)
	}
	if c.snap != nil {
		now := TakeSnapshot()
		now.RunDir = c.runDir
		if diff := c.snap.Diff(now); len(diff) > 0 {
			errs = append(errs, fmt.Errorf("machine differs from before Up:\n  %s", strings.Join(diff, "\n  ")))
		}
	}
	c.releaseLock()
	c.logf("cluster: down in %v (pods deleted in %v)", time.Since(t0).Round(time.Millisecond), tPods.Round(time.Millisecond))
	return errors.Join(errs...)
}

var componentNames = map[string]bool{
	"containerd": true, "etcd": true, "kube-apiserver": true, "kube-controller-manager": true,
	"kube-scheduler": true, "kube-proxy": true, "kubelet": true,
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

// removeContainers force-deletes every task and container in containerd's
// k8s.io namespace.
func (c *Cluster) removeContainers() {
	ctr := c.containerdBin("ctr")
	sock := c.containerdSockPath()
	out, err := run(ctr, "-a", sock, "-n", "k8s.io", "containers", "list", "-q")
	if err != nil {
		c.logf("cluster: listing containers: %v", err)
		return
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return
	}
	c.logf("cluster: removing %d containers left in containerd", len(ids))
	for _, id := range ids {
		run(ctr, "-a", sock, "-n", "k8s.io", "tasks", "delete", "--force", id)
	}
	run(ctr, append([]string{"-a", sock, "-n", "k8s.io", "containers", "delete"}, ids...)...)
}
