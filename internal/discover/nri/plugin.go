// Package nri serves runtime pods from inside the container runtime's start
// path: the agent as an NRI (Node Resource Interface) plugin of containerd
// 2 or CRI-O. At StartContainer the container's cgroup exists and none of
// its instructions has run yet, so the slots and the pod's socket made
// there are ready before its first request. The pod watch
// (internal/discover/kubernetes) stays: it serves what NRI did not (NRI
// off, a container started while the agent was away, an annotated pod
// without cpuslot.dev/container) and tells the pod's owner through Events.
// Both report to the same Sink, whose Prepare is idempotent: the first
// caller makes the pool, the second finds it.
package nri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
	k8s "github.com/cpuslot/cpuslot/internal/discover/kubernetes"
	"github.com/cpuslot/cpuslot/internal/metrics"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// Config shapes the plugin.
type Config struct {
	// Socket is the runtime's NRI socket.
	Socket string
	// StartTimeout bounds how long StartContainer (and UpdateContainer)
	// wait for the agent before answering; the runtime disconnects a
	// plugin slower than its request timeout (2 s in containerd and
	// CRI-O), so it stays well inside that.
	StartTimeout time.Duration
	// The pod watch's settings: the same selection, pool settings and
	// socket place.
	PodsDir      string
	SocketVolume string
	Selector     k8s.Selector
	Pool         settings.Pool
	Ceilings     settings.Ceilings
}

// PluginName and PluginIndex identify the plugin to the runtime; the index
// orders plugins (cpuslot needs no place before or after others).
const (
	PluginName  = "cpuslot"
	PluginIndex = "50"
)

// Retry bounds the wait between attempts to reach the runtime.
var (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// Plugin is the NRI plugin; Run connects it.
type Plugin struct {
	cfg   Config
	h     *cgroup.Hierarchy
	log   *slog.Logger
	count func(metrics.Reason)
	sink  discover.Sink

	mu sync.Mutex
	// served maps a container ID to the cgroup its pool was asked for.
	served map[string]string
}

// New makes the plugin; count counts a fail-open answer
// (metrics.NRIFailOpen).
func New(cfg Config, h *cgroup.Hierarchy, log *slog.Logger, count func(metrics.Reason)) *Plugin {
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = time.Second
	}
	return &Plugin{cfg: cfg, h: h, log: log.With("source", "nri"), count: count, served: map[string]string{}}
}

// Run connects to the runtime in the background and reconnects whenever the
// connection ends (the runtime restarted), until ctx ends. It does not wait
// for the runtime: the pod watch serves meanwhile.
func (p *Plugin) Run(ctx context.Context, sink discover.Sink) error {
	p.sink = sink
	go p.connect(ctx)
	return nil
}

func (p *Plugin) connect(ctx context.Context) {
	backoff, failing := minBackoff, false
	for ctx.Err() == nil {
		closed := make(chan struct{})
		var once sync.Once
		st, err := stub.New(p, stub.WithPluginName(PluginName), stub.WithPluginIdx(PluginIndex),
			stub.WithSocketPath(p.cfg.Socket), stub.WithLogger(nriLogger{p.log}),
			stub.WithOnClose(func() { once.Do(func() { close(closed) }) }))
		if err == nil {
			err = st.Start(ctx)
		}
		if err != nil {
			level := slog.LevelDebug
			if !failing {
				level, failing = slog.LevelWarn, true // once an outage
			}
			p.log.Log(ctx, level, "runtime's NRI socket not reachable (NRI off in the runtime, or the runtime down); the pod watch serves meanwhile, retrying",
				"socket", p.cfg.Socket, "err", err, "in", backoff.String())
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff, failing = minBackoff, false
		p.log.Info("connected to the runtime as an NRI plugin", "socket", p.cfg.Socket, "runtimeNRI", st.RuntimeNRIVersion())
		select {
		case <-ctx.Done():
			st.Stop()
			return
		case <-closed:
			p.log.Warn("the runtime closed the NRI connection (restarted?); reconnecting", "socket", p.cfg.Socket)
		}
	}
}

// Configure subscribes to the events the plugin handles.
func (p *Plugin) Configure(_ context.Context, _, runtime, version string) (api.EventMask, error) {
	p.log.Info("configured by the runtime", "runtime", runtime, "version", version)
	return api.MustParseEventMask("StartContainer", "UpdateContainer", "StopContainer", "RemoveContainer"), nil
}

// Synchronize adopts the selected containers that run already (started
// while the agent was away); their pools are made in the background.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	byID := map[string]*api.PodSandbox{}
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	n := 0
	for _, c := range ctrs {
		pod := byID[c.GetPodSandboxId()]
		if pod == nil || c.GetState() != api.ContainerState_CONTAINER_RUNNING {
			continue
		}
		if dc, ok := p.selected(pod, c); ok {
			n++
			go p.prepare(c.GetId(), dc)
		}
	}
	p.log.Info("synchronized with the runtime", "pods", len(pods), "containers", len(ctrs), "adopting", n)
	return nil, nil
}

// StartContainer prepares a selected container's pool and socket before the
// runtime starts its process, waiting at most StartTimeout; it always
// answers success, as an error would fail the container's start.
func (p *Plugin) StartContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	dc, ok := p.selected(pod, c)
	if !ok {
		return nil
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- p.prepare(c.GetId(), dc) }()
	select {
	case err := <-done:
		var partial *discover.Partial
		if err != nil && !errors.As(err, &partial) {
			p.failOpen("not served at its start; the pod watch retries", dc.Name, err)
			return nil
		}
		p.log.Info("served before the container's start", "container", dc.Name, "took", time.Since(start).Round(time.Microsecond).String())
	case <-time.After(p.cfg.StartTimeout):
		p.failOpen("pool not ready within nri.startTimeout; the container starts, its pool is made in the background", dc.Name,
			fmt.Errorf("waited %v", p.cfg.StartTimeout))
	}
	return nil
}

// UpdateContainer lowers a served container's slots to a new CPU limit
// before the runtime writes it: cgroup v1 refuses a container a quota
// below a slot's.
func (p *Plugin) UpdateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container, res *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	cg, ok := p.served[c.GetId()]
	p.mu.Unlock()
	if !ok {
		return nil, nil
	}
	limit := limitMilli(res)
	done := make(chan struct{})
	go func() { p.sink.Resize(cg, limit); close(done) }()
	select {
	case <-done:
	case <-time.After(p.cfg.StartTimeout):
		p.failOpen("slots not lowered within nri.startTimeout; the runtime writes the new limit now", c.GetName(),
			fmt.Errorf("limit %dm", limit))
	}
	return nil, nil
}

// StopContainer forgets a served container.
func (p *Plugin) StopContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) ([]*api.ContainerUpdate, error) {
	p.forget(c.GetId())
	return nil, nil
}

// RemoveContainer forgets a served container (a stop may have gone
// unseen).
func (p *Plugin) RemoveContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	p.forget(c.GetId())
	return nil
}

// CgroupOf is the cgroup of a container the runtime showed the plugin
// (kubernetes.Config.Known): the pod watch then needs no containerd, which
// a CRI-O node does not have.
func (p *Plugin) CgroupOf(containerID string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cg, ok := p.served[containerID]
	return cg, ok
}

func (p *Plugin) forget(id string) {
	p.mu.Lock()
	cg, ok := p.served[id]
	delete(p.served, id)
	p.mu.Unlock()
	if ok {
		go p.sink.Forget(cg)
	}
}

func (p *Plugin) prepare(id string, c discover.Container) error {
	p.mu.Lock()
	p.served[id] = c.CgroupPath
	p.mu.Unlock()
	return p.sink.Prepare(c)
}

func (p *Plugin) failOpen(what, name string, err error) {
	p.count(metrics.NRIFailOpen)
	p.log.Warn(what, "container", name, "err", err)
}

// selected is what to serve for container c of pod, by the pod watch's
// rules applied to what the runtime hands over (the kubelet copies the
// pod's labels and annotations to its sandbox).
func (p *Plugin) selected(pod *api.PodSandbox, c *api.Container) (discover.Container, bool) {
	name, why := p.cfg.Selector.Named(pod.GetLabels(), pod.GetAnnotations())
	if why != "" || name != c.GetName() {
		// Not a runtime pod, not its served container, or an annotated
		// pod's first container, which only the pod's spec names: the pod
		// watch serves that one.
		return discover.Container{}, false
	}
	uid := pod.GetUid()
	if !validUID(uid) {
		p.log.Warn("pod UID unfit for a path; the pod watch serves it", "pod", pod.GetNamespace()+"/"+pod.GetName(), "uid", uid)
		return discover.Container{}, false
	}
	sock := k8s.SocketPath(p.cfg.PodsDir, uid, p.cfg.SocketVolume)
	if fi, err := os.Stat(filepath.Dir(sock)); err != nil || !fi.IsDir() {
		// The pod lacks the emptyDir (the pod watch tells its owner).
		return discover.Container{}, false
	}
	cgPath, err := k8s.CgroupFromSpec(c.GetLinux().GetCgroupsPath())
	if err != nil {
		p.log.Warn("container's cgroup unknown; the pod watch serves it", "container", c.GetName(), "err", err)
		return discover.Container{}, false
	}
	limit := limitMilli(c.GetLinux().GetResources())
	cfg, _ := k8s.PoolConfig(p.cfg.Pool, p.cfg.Ceilings, pod.GetAnnotations(), limit) // the pod watch reports bad annotations
	return discover.Container{
		Name:       k8s.ContainerName(pod.GetNamespace(), pod.GetName(), c.GetName()),
		CgroupPath: p.h.ProcessCgroup(cgPath),
		Pool:       &cfg,
		Socket:     sock,
		FirstSlots: true,
	}, true
}

// validUID admits what the API server makes (a UUID) and the kubelet's
// static-pod hashes: letters, digits and dashes, so it cannot leave the
// pods directory.
func validUID(uid string) bool {
	if uid == "" || len(uid) > 128 {
		return false
	}
	for _, r := range uid {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// limitMilli is the CPU limit of a container's resources in millicores (0:
// none), as the kubelet derives quota and period from it.
func limitMilli(res *api.LinuxResources) uint32 {
	quota := res.GetCpu().GetQuota().GetValue()
	period := res.GetCpu().GetPeriod().GetValue()
	if quota <= 0 || period == 0 {
		return 0
	}
	if quota > math.MaxInt64/1000 {
		return math.MaxUint32
	}
	return uint32(min(uint64(quota)*1000/period, math.MaxUint32))
}

// nriLogger sends NRI's own log to the agent's.
type nriLogger struct{ l *slog.Logger }

func (n nriLogger) Debugf(ctx context.Context, f string, a ...any) {
	n.l.DebugContext(ctx, fmt.Sprintf(f, a...))
}
func (n nriLogger) Infof(ctx context.Context, f string, a ...any) {
	n.l.DebugContext(ctx, fmt.Sprintf(f, a...))
}
func (n nriLogger) Warnf(ctx context.Context, f string, a ...any) {
	n.l.WarnContext(ctx, fmt.Sprintf(f, a...))
}
func (n nriLogger) Errorf(ctx context.Context, f string, a ...any) {
	n.l.ErrorContext(ctx, fmt.Sprintf(f, a...))
}
