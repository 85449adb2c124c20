package nri

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"

	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/cgroup/cgrouptest"
	"github.com/cpuslot/cpuslot/internal/discover"
	k8s "github.com/cpuslot/cpuslot/internal/discover/kubernetes"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// These tests drive the plugin with NRI's own runtime side (the library
// containerd and CRI-O embed), on a socket of the test's own, against a
// real agent on the real kernel's cgroups: the runtime's calls are what
// containerd's CRI start path makes, in its order (RunPodSandbox,
// CreateContainer, StartContainer, ...), with the container's cgroup made
// as the runtime's create makes it.

// The runtime's request timeout (2 s in containerd and CRI-O) and the
// plugin's wait are raised to bounds for a hang: a loaded machine may be
// slow, and what the tests check is the order (slots made before the
// answer), not a time. TestSlowPrepare keeps the plugin's wait short.
func init() { adaptation.SetPluginRequestTimeout(2 * time.Minute) }

// runtime is an NRI runtime that knows which pods and containers run (what
// it hands a plugin at Synchronize).
type runtime struct {
	t    *testing.T
	sock string
	r    *adaptation.Adaptation
	// front forwards the plugin's connections to the runtime's socket,
	// so that a restart can close them as a runtime process's exit does
	// (the library's Stop leaves external plugins connected).
	front *proxy
	// plugins is how many plugins the runtime relays requests to; the
	// runtime adds a plugin only after its Synchronize.
	plugins atomic.Int64
	// latency is the plugin's last StartContainer as the runtime timed it.
	latency atomic.Int64

	mu   sync.Mutex
	pods map[string]*api.PodSandbox
	ctrs map[string]*api.Container
}

func newRuntime(t *testing.T, sock string) *runtime {
	rt := &runtime{t: t, sock: sock, pods: map[string]*api.PodSandbox{}, ctrs: map[string]*api.Container{}}
	rt.start()
	return rt
}

func (rt *runtime) start() {
	t := rt.t
	t.Helper()
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		rt.mu.Lock()
		var pods []*api.PodSandbox
		var ctrs []*api.Container
		for _, p := range rt.pods {
			pods = append(pods, p)
		}
		for _, c := range rt.ctrs {
			ctrs = append(ctrs, c)
		}
		rt.mu.Unlock()
		_, err := cb(ctx, pods, ctrs)
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	dir := t.TempDir()
	back := rt.sock + ".runtime"
	rt.plugins.Store(0)
	r, err := adaptation.New("cpuslot-test-runtime", "v0", sync, update, adaptation.WithMetrics(runtimeMetrics{rt}),
		adaptation.WithSocketPath(back), adaptation.WithPluginPath(dir), adaptation.WithPluginConfigPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	rt.r = r
	rt.front = listenProxy(t, rt.sock, back)
	t.Cleanup(rt.down)
}

// runtimeMetrics is how the test sees the runtime's view of its plugins.
type runtimeMetrics struct{ rt *runtime }

func (m runtimeMetrics) RecordPluginInvocation(string, string, error) {}
func (m runtimeMetrics) RecordPluginLatency(_, op string, d time.Duration) {
	if op == "StartContainer" {
		m.rt.latency.Store(int64(d))
	}
}
func (m runtimeMetrics) RecordPluginAdjustments(string, string, *api.ContainerAdjustment, int, int) {}
func (m runtimeMetrics) UpdatePluginCount(n int)                                                    { m.rt.plugins.Store(int64(n)) }

// waitPlugin waits until the runtime relays requests to the plugin.
func (rt *runtime) waitPlugin() {
	rt.t.Helper()
	waitUntil(rt.t, "the runtime to add the plugin", func() bool { return rt.plugins.Load() > 0 })
}

// down stops the runtime as its process's exit would: its socket gone,
// its connections closed. What runs keeps running.
func (rt *runtime) down() {
	rt.front.close()
	rt.r.Stop()
}

// restart stops the runtime and starts it again on the same socket, as a
// containerd restart does.
func (rt *runtime) restart() {
	rt.down()
	rt.start()
}

// proxy forwards connections on one Unix socket to another.
type proxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func listenProxy(t *testing.T, front, back string) *proxy {
	os.Remove(front)
	l, err := net.Listen("unix", front)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("unix", back)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, b)
			p.mu.Unlock()
			go func() { io.Copy(b, c); b.Close() }()
			go func() { io.Copy(c, b); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) close() {
	p.l.Close() // removes the socket file
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// run starts a container of pod the way containerd's CRI does, returning
// how long StartContainer took (the plugin answers it after preparing).
// As containerd's CRI, it blocks plugin synchronization until the container
// is in the runtime's list: a plugin registering meanwhile gets it at its
// Synchronize, or its events once added, never neither.
func (rt *runtime) run(pod *api.PodSandbox, c *api.Container) time.Duration {
	t := rt.t
	t.Helper()
	defer rt.r.BlockPluginSync().Unblock()
	ctx := context.Background()
	rt.mu.Lock()
	_, known := rt.pods[pod.Id]
	rt.pods[pod.Id] = pod
	rt.mu.Unlock()
	if !known {
		if err := rt.r.RunPodSandbox(ctx, &adaptation.RunPodSandboxRequest{Pod: pod}); err != nil {
			t.Fatal(err)
		}
	}
	c.State = api.ContainerState_CONTAINER_CREATED
	if _, err := rt.r.CreateContainer(ctx, &adaptation.CreateContainerRequest{Pod: pod, Container: c}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := rt.r.StartContainer(ctx, &adaptation.StartContainerRequest{Pod: pod, Container: c}); err != nil {
		t.Fatalf("StartContainer failed (a plugin must fail open): %v", err)
	}
	took := time.Since(start)
	c.State = api.ContainerState_CONTAINER_RUNNING
	rt.mu.Lock()
	rt.ctrs[c.Id] = c
	rt.mu.Unlock()
	return took
}

func (rt *runtime) update(pod *api.PodSandbox, c *api.Container, milli int64) {
	rt.t.Helper()
	res := &api.LinuxResources{Cpu: &api.LinuxCPU{Quota: api.Int64(milli * 100), Period: api.UInt64(100000)}}
	if _, err := rt.r.UpdateContainer(context.Background(), &adaptation.UpdateContainerRequest{Pod: pod, Container: c, LinuxResources: res}); err != nil {
		rt.t.Fatalf("UpdateContainer failed (a plugin must fail open): %v", err)
	}
}

func (rt *runtime) stop(pod *api.PodSandbox, c *api.Container) {
	rt.t.Helper()
	defer rt.r.BlockPluginSync().Unblock()
	ctx := context.Background()
	c.State = api.ContainerState_CONTAINER_STOPPED
	if _, err := rt.r.StopContainer(ctx, &adaptation.StopContainerRequest{Pod: pod, Container: c}); err != nil {
		rt.t.Fatal(err)
	}
	if err := rt.r.RemoveContainer(ctx, &adaptation.RemoveContainerRequest{Pod: pod, Container: c}); err != nil {
		rt.t.Fatal(err)
	}
	rt.mu.Lock()
	delete(rt.ctrs, c.Id)
	rt.mu.Unlock()
}

// counter records what the plugin counted.
type counter struct {
	mu sync.Mutex
	n  map[metrics.Reason]int
}

func (c *counter) count(r metrics.Reason) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[metrics.Reason]int{}
	}
	c.n[r]++
}

func (c *counter) get(r metrics.Reason) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[r]
}

// env is one node: a pods directory, an NRI socket, and the agents run on it.
type env struct {
	t       *testing.T
	h       *cgroup.Hierarchy
	podsDir string
	sock    string
	counted counter
}

func newEnv(t *testing.T) *env {
	h := cgrouptest.Kernel(t)
	podsDir := t.TempDir()
	// A short socket path (sun_path holds 108 bytes).
	sockDir, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	return &env{t: t, h: h, podsDir: podsDir, sock: filepath.Join(sockDir, "nri.sock")}
}

// pod is a sandbox selected by annotation, its container "fn" named, with
// the socket volume's directory made as the kubelet makes it.
func (e *env) pod(uid, prewarm string) *api.PodSandbox {
	if err := os.MkdirAll(filepath.Dir(k8s.SocketPath(e.podsDir, uid, "cpuslot")), 0o777); err != nil {
		e.t.Fatal(err)
	}
	return &api.PodSandbox{Id: "sb-" + uid, Name: "pod-" + uid, Namespace: "default", Uid: uid,
		Annotations: map[string]string{k8s.AnnEnabled: "true", k8s.AnnContainer: "fn", annotation("pool.prewarm"): prewarm}}
}

func annotation(key string) string {
	k, ok := settings.Lookup(key)
	if !ok || k.Annotation == "" {
		panic("no annotation for setting " + key)
	}
	return settings.AnnotationPrefix + k.Annotation
}

// container is container "fn" of pod in cgroup path cgroupsPath (as the
// OCI spec names it), with a CPU limit of limitMilli.
func container(pod *api.PodSandbox, id, cgroupsPath string, limitMilli int64) *api.Container {
	c := &api.Container{Id: id, PodSandboxId: pod.Id, Name: "fn", Linux: &api.LinuxContainer{CgroupsPath: cgroupsPath}}
	if limitMilli > 0 {
		c.Linux.Resources = &api.LinuxResources{Cpu: &api.LinuxCPU{Quota: api.Int64(limitMilli * 100), Period: api.UInt64(100000)}}
	}
	return c
}

// agentRun is one agent with the plugin, until stop or the test's end.
type agentRun struct {
	a      *agent.Agent
	p      *Plugin
	cancel func()
	done   chan error
}

func (r *agentRun) stop() {
	r.cancel()
	if err := <-r.done; err != nil {
		panic(err)
	}
}

// startAgent runs a real agent (no socket or HTTP of its own, hourly
// maintenance) with the plugin as its only source; wrap, when set, stands
// between the plugin and the agent.
func (e *env) startAgent(startTimeout time.Duration, wrap func(discover.Sink) discover.Sink) *agentRun {
	t := e.t
	cfg := agent.DefaultConfig()
	cfg.Socket, cfg.HTTP = "", ""
	cfg.ReapInterval = agent.Duration{Duration: time.Hour}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	a, err := agent.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	pc, _ := cfg.Settings()
	p := New(Config{Socket: e.sock, StartTimeout: startTimeout, PodsDir: e.podsDir, SocketVolume: "cpuslot",
		Selector: k8s.Selector{Annotated: true}, Pool: pc, Ceilings: settings.DefaultCeilings()}, e.h, log, e.counted.count)
	var src discover.Source = p
	if wrap != nil {
		src = wrapped{p, wrap}
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &agentRun{a: a, p: p, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx, []discover.Source{src}, false) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-r.done
		}
	})
	old := r.cancel
	r.cancel = func() { stopped = true; old() }
	waitUntil(t, "agent ready", a.Ready)
	return r
}

// wrapped hands the plugin a wrapped sink.
type wrapped struct {
	p    *Plugin
	wrap func(discover.Sink) discover.Sink
}

func (w wrapped) Run(ctx context.Context, sink discover.Sink) error {
	return w.p.Run(ctx, w.wrap(sink))
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// slots is what the agent serves for the container named name, by quota.
func slots(a *agent.Agent, name string) string {
	m := map[uint32]int{}
	for _, s := range a.Summaries() {
		if s.Name != name {
			continue
		}
		for _, q := range s.Quotas {
			if q.Slots > 0 {
				m[q.QuotaMilli] += q.Slots
			}
		}
	}
	return fmt.Sprint(m)
}

// TestStartContainer: when the runtime's StartContainer returns, the
// container's slots and its pod's socket exist (no instruction of the
// container has run yet: the runtime starts its process after this call).
// Then an update to a lower limit removes the slot above it before
// UpdateContainer returns, so the runtime's write of that limit succeeds on
// cgroup v1; stop and remove forget the container.
func TestStartContainer(t *testing.T) {
	e := newEnv(t)
	rt := newRuntime(t, e.sock)
	r := e.startAgent(time.Minute, nil)
	rt.waitPlugin()

	rel := cgrouptest.NewContainer(t, e.h, 1000)
	pod := e.pod("uid-start", "250m=1,500m=1")
	c := container(pod, "c-start", rel, 1000)
	took := rt.run(pod, c)
	name := k8s.ContainerName("default", pod.Name, "fn")
	if got := slots(r.a, name); got != "map[250:1 500:1]" {
		t.Fatalf("when StartContainer returned, served %s", got)
	}
	if _, err := os.Stat(k8s.SocketPath(e.podsDir, pod.Uid, "cpuslot")); err != nil {
		t.Fatalf("pod socket not there when StartContainer returned: %v", err)
	}
	if n := len(cgrouptest.Leftovers(e.h, rel)); n != 2 {
		t.Fatalf("%d slot cgroups in the container", n)
	}
	t.Logf("StartContainer to first slots ready (NRI path, 2 pre-warmed slots): %v (the runtime's own timing of the plugin: %v)",
		took, time.Duration(rt.latency.Load()))

	// An update to 400m: the 500m slot goes before the runtime writes it.
	rt.update(pod, c, 400)
	if got := slots(r.a, name); got != "map[250:1]" {
		t.Fatalf("when UpdateContainer to 400m returned, served %s", got)
	}
	quotaFile, quota := filepath.Join(e.h.CPURoot, rel, "cpu.cfs_quota_us"), "40000"
	if e.h.Version == 2 {
		quotaFile, quota = filepath.Join(e.h.CPURoot, rel, "cpu.max"), "40000 100000"
	}
	var werr error
	// The kernel unlinks a removed cgroup asynchronously: the first write
	// may still see it, and the runtime retries as this does.
	waitUntil(t, "the container's new limit to be accepted", func() bool {
		werr = os.WriteFile(quotaFile, []byte(quota), 0)
		return werr == nil
	})

	rt.stop(pod, c)
	waitUntil(t, "the container to be forgotten", func() bool { return len(r.a.Summaries()) == 0 })
	waitUntil(t, "its slots to be removed", func() bool { return len(cgrouptest.Leftovers(e.h, rel)) == 0 })
	if _, err := os.Stat(k8s.SocketPath(e.podsDir, pod.Uid, "cpuslot")); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
	if n := e.counted.get(metrics.NRIFailOpen); n != 0 {
		t.Errorf("counted %d fail-open answers", n)
	}
}

// TestFirstSlots: StartContainer waits for one slot of each pre-warmed
// quota and the socket only; the rest of the pre-warmed slots follow.
func TestFirstSlots(t *testing.T) {
	e := newEnv(t)
	rt := newRuntime(t, e.sock)
	r := e.startAgent(time.Minute, nil)
	rt.waitPlugin()
	rel := cgrouptest.NewContainer(t, e.h, 0)
	pod := e.pod("uid-first-slots", "250m=3,500m=2")
	rt.run(pod, container(pod, "c-first-slots", rel, 0))
	name := k8s.ContainerName("default", pod.Name, "fn")
	m := map[uint32]int{}
	for _, s := range r.a.Summaries() {
		for _, q := range s.Quotas {
			m[q.QuotaMilli] = q.Slots
		}
	}
	if m[250] < 1 || m[500] < 1 {
		t.Fatalf("when StartContainer returned, slots %v: want one of each quota at least", m)
	}
	if _, err := os.Stat(k8s.SocketPath(e.podsDir, pod.Uid, "cpuslot")); err != nil {
		t.Fatalf("pod socket not there when StartContainer returned: %v", err)
	}
	waitUntil(t, "the rest of the pre-warmed slots", func() bool { return slots(r.a, name) == "map[250:3 500:2]" })
}

// TestNotSelected: a pod that is not a runtime pod, a runtime pod's other
// container, an annotated pod that does not name its container (only the
// pod's spec says which is first: the pod watch serves it), a pod without
// the socket volume and a pod UID that would leave the pods directory are
// all left alone, and their containers start.
func TestNotSelected(t *testing.T) {
	e := newEnv(t)
	rt := newRuntime(t, e.sock)
	r := e.startAgent(time.Minute, nil)
	rt.waitPlugin()
	rel := cgrouptest.NewContainer(t, e.h, 0)

	plain := e.pod("uid-plain", "250m=1")
	plain.Annotations = nil
	rt.run(plain, container(plain, "c-plain", rel, 0))

	sidecar := e.pod("uid-side", "250m=1")
	side := container(sidecar, "c-side", rel, 0)
	side.Name = "sidecar"
	rt.run(sidecar, side)

	first := e.pod("uid-first", "250m=1")
	delete(first.Annotations, k8s.AnnContainer)
	rt.run(first, container(first, "c-first", rel, 0))

	noVolume := e.pod("uid-novol", "250m=1")
	noVolume.Uid = "uid-novol-x" // its volume directory was not made
	rt.run(noVolume, container(noVolume, "c-novol", rel, 0))

	// A UID that is a path: it would put this pod's socket in another
	// pod's volume (uid-esc's, which exists).
	escape := e.pod("uid-esc", "250m=1")
	escape.Uid = "other/../uid-esc"
	rt.run(escape, container(escape, "c-esc", rel, 0))

	if s := r.a.Summaries(); len(s) != 0 {
		t.Fatalf("served %+v", s)
	}
	if n := len(cgrouptest.Leftovers(e.h, rel)); n != 0 {
		t.Fatalf("%d slots made", n)
	}
}

// blockingSink holds Prepare until released: a cgroup write that hangs
// (a kernel busy with cgroup locks) as the plugin sees it.
type blockingSink struct {
	discover.Sink
	release chan struct{}
}

func (b blockingSink) Prepare(c discover.Container) error {
	<-b.release
	return b.Sink.Prepare(c)
}

// TestSlowPrepare: the agent does not finish preparing within
// nri.startTimeout. StartContainer still answers success without waiting
// for it (were it to wait, the runtime would drop the plugin at its request
// timeout and count no miss), the miss is counted, the plugin stays
// connected, and the pool is made in the background once the write goes
// through.
func TestSlowPrepare(t *testing.T) {
	e := newEnv(t)
	rt := newRuntime(t, e.sock)
	release := make(chan struct{})
	r := e.startAgent(200*time.Millisecond, func(s discover.Sink) discover.Sink { return blockingSink{s, release} })
	rt.waitPlugin()

	rel := cgrouptest.NewContainer(t, e.h, 0)
	pod := e.pod("uid-slow", "250m=1")
	c := container(pod, "c-slow", rel, 0)
	rt.run(pod, c) // Fatal if the start failed
	if n := e.counted.get(metrics.NRIFailOpen); n != 1 {
		t.Fatalf("counted %d fail-open answers, want 1", n)
	}
	if s := r.a.Summaries(); len(s) != 0 {
		t.Fatalf("served while the write hangs: %+v", s)
	}
	close(release)
	name := k8s.ContainerName("default", pod.Name, "fn")
	waitUntil(t, "the pool made in the background", func() bool { return slots(r.a, name) == "map[250:1]" })
	// The plugin is still connected: the runtime did not drop it.
	c2rel := cgrouptest.NewContainer(t, e.h, 0)
	pod2 := e.pod("uid-slow2", "250m=1")
	rt.run(pod2, container(pod2, "c-slow2", c2rel, 0))
	if got := slots(r.a, k8s.ContainerName("default", pod2.Name, "fn")); got != "map[250:1]" {
		t.Fatalf("the next container served %s when StartContainer returned", got)
	}
}

// TestAgentRestart: a container served at its start; the agent stops
// (slots stay) and a second container starts while it is away; the
// runtime is reached only later (it was not up when the agent started, as
// with NRI off in the runtime), then restarts. Each time the plugin
// connects it is synchronized and adopts what runs: both containers are
// served, the first with the slots it had.
func TestAgentRestart(t *testing.T) {
	e := newEnv(t)
	rt := newRuntime(t, e.sock)
	r := e.startAgent(time.Minute, nil)
	rt.waitPlugin()
	rel1 := cgrouptest.NewContainer(t, e.h, 0)
	pod1 := e.pod("uid-r1", "250m=2")
	rt.run(pod1, container(pod1, "c-r1", rel1, 0))
	name1 := k8s.ContainerName("default", pod1.Name, "fn")
	// StartContainer waits for the first slot of each quota only
	// (TestFirstSlots); the rest are made in the background.
	if got := slots(r.a, name1); got != "map[250:1]" && got != "map[250:2]" {
		t.Fatalf("when StartContainer returned, served %s", got)
	}
	waitUntil(t, "the first container's two slots made", func() bool {
		return slots(r.a, name1) == "map[250:2]" && len(cgrouptest.Leftovers(e.h, rel1)) == 2
	})
	slots1 := strings.Join(cgrouptest.Leftovers(e.h, rel1), ",")
	r.stop()

	rel2 := cgrouptest.NewContainer(t, e.h, 0)
	pod2 := e.pod("uid-r2", "250m=1")
	rt.run(pod2, container(pod2, "c-r2", rel2, 0))
	name2 := k8s.ContainerName("default", pod2.Name, "fn")

	// The runtime is down when the agent starts: the agent is ready all
	// the same (the pod watch would serve), and the plugin keeps trying.
	rt.down()
	r = e.startAgent(time.Minute, nil)
	rt.start()
	rt.waitPlugin()
	waitUntil(t, "both containers adopted", func() bool {
		return slots(r.a, name1) == "map[250:2]" && slots(r.a, name2) == "map[250:1]"
	})
	if got := strings.Join(cgrouptest.Leftovers(e.h, rel1), ","); got != slots1 {
		t.Errorf("first container's slots %s, before the restart %s (not adopted)", got, slots1)
	}

	// The runtime restarts: the plugin reconnects. A container started
	// meanwhile is served at its start once the plugin is back, or at the
	// plugin's Synchronize if it starts before.
	rt.restart()
	rel3 := cgrouptest.NewContainer(t, e.h, 0)
	pod3 := e.pod("uid-r3", "250m=1")
	rt.run(pod3, container(pod3, "c-r3", rel3, 0))
	name3 := k8s.ContainerName("default", pod3.Name, "fn")
	waitUntil(t, "the plugin back after the runtime's restart", func() bool { return slots(r.a, name3) == "map[250:1]" })
}

// TestCRIOLayout: a CRI-O container under the systemd cgroup manager, as
// crun lays it out: the OCI spec names "<pod slice>:crio:<id>", systemd
// makes the scope crio-<id>.scope in the nested slices, and crun puts the
// container's processes in the scope's "container" sub-cgroup. The slots
// are made there, where the processes are.
func TestCRIOLayout(t *testing.T) {
	e := newEnv(t)
	rt := newRuntime(t, e.sock)
	r := e.startAgent(time.Minute, nil)
	rt.waitPlugin()

	top := fmt.Sprintf("cpuslottest%d", os.Getpid())
	podSlice := top + "-podcrio.slice"
	id := "0123456789abcdef"
	scope := "/" + top + ".slice/" + podSlice + "/crio-" + id + ".scope"
	procs := scope + "/container"
	roots := []string{e.h.CPURoot}
	if e.h.AcctRoot != "" {
		roots = append(roots, e.h.AcctRoot)
	}
	t.Cleanup(func() {
		if err := e.h.RemoveTree("/"+top+".slice", cgroup.TreeOptions{}); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	for _, root := range roots {
		if err := os.MkdirAll(filepath.Join(root, procs), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"/" + top + ".slice", "/" + top + ".slice/" + podSlice, scope} {
		if err := e.h.DelegateCPU(p); err != nil {
			t.Fatal(err)
		}
	}
	pod := e.pod("uid-crio", "250m=1")
	rt.run(pod, container(pod, id, podSlice+":crio:"+id, 0))
	if got := slots(r.a, k8s.ContainerName("default", pod.Name, "fn")); got != "map[250:1]" {
		t.Fatalf("served %s", got)
	}
	if n := len(cgrouptest.Leftovers(e.h, procs)); n != 1 {
		t.Fatalf("%d slots in the container sub-cgroup, want 1 (in the scope: %v)", n, cgrouptest.Leftovers(e.h, scope))
	}
}
