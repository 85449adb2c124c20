package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
	"github.com/cpuslot/cpuslot/internal/health"
	"github.com/cpuslot/cpuslot/internal/settings"
)

// Event reasons, on the pod.
const (
	ReasonServing           = "CpuslotServing"
	ReasonInvalidAnnotation = "CpuslotInvalidAnnotation"
	ReasonCgroupNotFound    = "CpuslotCgroupNotFound"
	ReasonPrepareFailed     = "CpuslotPrepareFailed"
	ReasonResized           = "CpuslotResized"
	ReasonAnnotationClamped = "CpuslotAnnotationClamped"
)

// Config shapes the source.
type Config struct {
	NodeName            string
	ContainerdSocket    string
	ContainerdNamespace string
	PodsDir             string
	SocketVolume        string
	Selector            Selector
	// Pool is the default pool configuration (the chart's values).
	Pool settings.Pool
	// Ceilings bound what a pod's annotations may set.
	Ceilings settings.Ceilings
	// Resync re-examines every pod this often (retries what failed).
	Resync time.Duration
	// Known, when set, is the cgroup of a container the runtime already
	// told the agent of (its NRI plugin), asked before containerd.
	Known func(containerID string) (string, bool)
}

// Source watches this node's pods.
type Source struct {
	cfg       Config
	client    kubernetes.Interface
	hierarchy *cgroup.Hierarchy
	log       *slog.Logger
	recorder  record.EventRecorder
	events    *events

	ctrd   *containerd.Client
	ctrdMu sync.Mutex
	// cgroupOf finds a container's cgroup; containerd in production.
	cgroupOf func(ctx context.Context, containerID string) (string, error)

	// worker is the loop that serves the pods the informer reports.
	worker health.Loop

	// served maps pod UID to what the agent serves for it.
	mu     sync.Mutex
	served map[string]servedPod
}

type servedPod struct {
	key         string // namespace/name
	containerID string
	cgroupPath  string
	// cpuLimit is the served container's CPU limit as the kubelet last
	// reported it applied ("": none); askedMilli the one its spec asks
	// for (0: none).
	cpuLimit   string
	askedMilli uint32
}

// New makes a source; Run starts it.
func New(cfg Config, client kubernetes.Interface, h *cgroup.Hierarchy, log *slog.Logger) *Source {
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	ev := &events{b: record.NewBroadcaster()}
	ev.b.StartRecordingToSink(countingSink{&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}, ev})
	rec := countingRecorder{ev.b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "cpuslot-node-agent", Host: cfg.NodeName}), ev}
	s := &Source{cfg: cfg, client: client, hierarchy: h, log: log, recorder: rec, events: ev, served: map[string]servedPod{}}
	s.worker.Name = "pod informer worker"
	s.cgroupOf = s.containerdCgroup
	return s
}

// Run serves the node's runtime pods until ctx ends. It returns once the
// pod cache has synced and the pods present then have been examined; the
// watch goes on in the background.
func (s *Source) Run(ctx context.Context, sink discover.Sink) error {
	if s.cfg.NodeName == "" {
		return errors.New("kubernetes: node name unknown (set NODE_NAME from the downward API or -node-name)")
	}
	factory := informers.NewSharedInformerFactoryWithOptions(s.client, s.cfg.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", s.cfg.NodeName).String()
		}))
	podInformer := factory.Core().V1().Pods()
	lister := podInformer.Lister()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	reg, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	})
	if err != nil {
		return fmt.Errorf("kubernetes: pod event handler: %w", err)
	}
	factory.Start(ctx.Done())
	// The handler's sync, not the informer's: the informer's store can be
	// synced before the handler has been told of every pod in it, and then
	// the queue below would be empty and the agent ready before serving them.
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return errors.New("kubernetes: pod cache did not sync")
	}
	// Examine the pods present now before reporting ready.
	for queue.Len() > 0 {
		s.processNext(ctx, queue, lister, sink)
	}
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		for s.processNext(ctx, queue, lister, sink) {
		}
	}, time.Second)
	s.log.Info("watching pods", "node", s.cfg.NodeName)
	return nil
}

func (s *Source) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], lister listersv1.PodLister, sink discover.Sink) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	s.worker.Begin()
	defer s.worker.End()
	defer q.Done(key)
	if err := s.reconcile(ctx, key, lister, sink); err != nil {
		s.log.Warn("pod not served yet; retrying", "pod", key, "err", err)
		q.AddRateLimited(key)
		return true
	}
	q.Forget(key)
	return true
}

// reconcile makes the agent serve what one pod asks for, and nothing else.
func (s *Source) reconcile(ctx context.Context, key string, lister listersv1.PodLister, sink discover.Sink) error {
	ns, name, _ := strings.Cut(key, "/")
	pod, err := lister.Pods(ns).Get(name)
	if err != nil {
		s.forgetKey(key, sink) // deleted
		return nil
	}
	uid := string(pod.UID)
	want := s.desired(pod)
	s.mu.Lock()
	have, serving := s.served[uid]
	s.mu.Unlock()
	if serving && (want == nil || have.containerID != want.containerID) {
		sink.Forget(have.cgroupPath)
		s.mu.Lock()
		delete(s.served, uid)
		s.mu.Unlock()
		serving = false
	}
	if serving {
		s.followResize(pod, uid, have, want.container, sink)
	}
	if want == nil || serving {
		return nil
	}

	cfg, annErrs := PoolConfig(s.cfg.Pool, s.cfg.Ceilings, pod.Annotations, SpecCPULimitMilli(pod, want.container))
	for _, e := range annErrs {
		reason := ReasonInvalidAnnotation
		var cl *settings.Clamped
		if errors.As(e, &cl) {
			reason = ReasonAnnotationClamped
		}
		s.recorder.Eventf(pod, corev1.EventTypeWarning, reason, "%v", e)
	}
	if err := CheckQuotaAnnotation(pod, want.container); err != nil {
		s.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonInvalidAnnotation, "%v", err)
	}
	cg, known := "", false
	if s.cfg.Known != nil {
		cg, known = s.cfg.Known(want.containerID)
	}
	if !known {
		cg, err = s.cgroupOf(ctx, want.containerID)
	}
	if err != nil {
		s.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonCgroupNotFound, "container %s: %v", want.container, err)
		return err
	}
	c := discover.Container{
		Name:       ContainerName(pod.Namespace, pod.Name, want.container),
		CgroupPath: cg,
		Pool:       &cfg,
		Socket:     SocketPath(s.cfg.PodsDir, uid, s.cfg.SocketVolume),
	}
	if err := sink.Prepare(c); err != nil {
		var partial *discover.Partial
		if !errors.As(err, &partial) {
			s.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonPrepareFailed, "%v", err)
			return err
		}
		s.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonPrepareFailed, "serving with fewer pre-warmed slots: %v", partial.Err)
	}
	s.mu.Lock()
	s.served[uid] = servedPod{key: key, containerID: want.containerID, cgroupPath: cg, cpuLimit: CPULimit(pod, want.container),
		askedMilli: SpecCPULimitMilli(pod, want.container)}
	s.mu.Unlock()
	s.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonServing, "CPU slots ready for container %s (mode %s, prewarm %s)",
		want.container, cfg.Mode, settings.FormatPrewarm(cfg.Prewarm))
	return nil
}

// followResize follows an in-place resize of the served container's CPU
// limit. The limit its spec asks for goes to the agent at once (the slots
// above a lower one go before the kubelet applies it: cgroup v1 refuses a
// container a quota below a slot's); the agent also follows the cgroup's
// limit, the kernel's truth, every maintenance interval. Once the pod's
// status says the kubelet applied the new limit, an Event tells the pod's
// owner what it does to the slots.
func (s *Source) followResize(pod *corev1.Pod, uid string, have servedPod, container string, sink discover.Sink) {
	asked, now := SpecCPULimitMilli(pod, container), CPULimit(pod, container)
	if asked == have.askedMilli && now == have.cpuLimit {
		return
	}
	s.mu.Lock()
	if p, ok := s.served[uid]; ok && p.containerID == have.containerID {
		p.cpuLimit, p.askedMilli = now, asked
		s.served[uid] = p
	}
	s.mu.Unlock()
	if asked != have.askedMilli {
		sink.Resize(have.cgroupPath, asked)
	}
	if now == have.cpuLimit {
		return
	}
	from, to := have.cpuLimit, now
	if from == "" {
		from = "none"
	}
	if to == "" {
		to = "none"
	}
	msg := fmt.Sprintf("CPU limit of container %s resized from %s to %s: ", container, from, to)
	if now == "" {
		msg += "quotas up to the configured maximum are served"
	} else {
		msg += fmt.Sprintf("quotas up to %s are served; slots above it are removed, pre-warmed slots within it kept or made again", now)
	}
	s.log.Info("served container resized", "pod", pod.Namespace+"/"+pod.Name, "container", container, "from", from, "to", to)
	s.recorder.Event(pod, corev1.EventTypeNormal, ReasonResized, msg)
	if err := CheckQuotaAnnotation(pod, container); err != nil {
		s.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonInvalidAnnotation, "%v", err)
	}
}

type want struct {
	container, containerID string
}

// desired is what to serve for a pod now: its runtime container, once it
// runs and the pod declares the socket volume.
func (s *Source) desired(pod *corev1.Pod) *want {
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	name, why := s.cfg.Selector.ServedContainer(pod)
	if name == "" {
		if strings.HasPrefix(why, "pod has no container") {
			s.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonInvalidAnnotation, "%s", why)
		}
		return nil
	}
	if !HasVolume(pod, s.cfg.SocketVolume) {
		s.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonPrepareFailed,
			"pod lacks the emptyDir volume %q the agent puts its socket in; see the cpuslot chart's README", s.cfg.SocketVolume)
		return nil
	}
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name != name || st.State.Running == nil || st.ContainerID == "" {
			continue
		}
		_, id, ok := strings.Cut(st.ContainerID, "://")
		if !ok {
			return nil
		}
		return &want{container: name, containerID: id}
	}
	return nil // not running yet
}

// Report puts an Event on the served pod whose container holds cgroup cg
// (discover.Reporter); nothing when the source serves none.
func (s *Source) Report(cg, reason, message string) {
	s.mu.Lock()
	var best servedPod
	var bestUID string
	for uid, p := range s.served {
		if within(cg, p.cgroupPath) && len(p.cgroupPath) > len(best.cgroupPath) {
			best, bestUID = p, uid
		}
	}
	s.mu.Unlock()
	if bestUID == "" {
		return
	}
	ns, name, _ := strings.Cut(best.key, "/")
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: name, UID: types.UID(bestUID)}
	s.recorder.Event(ref, corev1.EventTypeWarning, reason, message)
}

// within reports whether cgroup path p is dir or below it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

func (s *Source) forgetKey(key string, sink discover.Sink) {
	s.mu.Lock()
	var victims []servedPod
	for uid, p := range s.served {
		if p.key == key {
			victims = append(victims, p)
			delete(s.served, uid)
		}
	}
	s.mu.Unlock()
	for _, p := range victims {
		sink.Forget(p.cgroupPath)
	}
}

// containerdCgroup asks containerd where a container's cgroup is: the
// cgroup of its task's process when it runs (the kernel's truth), else the
// cgroupsPath in its OCI spec.
func (s *Source) containerdCgroup(ctx context.Context, id string) (string, error) {
	c, err := s.containerd()
	if err != nil {
		return "", err
	}
	ctx = namespaces.WithNamespace(ctx, s.cfg.ContainerdNamespace)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ctr, err := c.LoadContainer(ctx, id)
	if err != nil {
		s.resetContainerd()
		return "", fmt.Errorf("containerd: %w", err)
	}
	if task, err := ctr.Task(ctx, nil); err == nil {
		if p, err := s.hierarchy.PathOfPID(int(task.Pid())); err == nil {
			return OutsideSlot(p), nil
		}
	}
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return "", fmt.Errorf("containerd spec: %w", err)
	}
	if spec.Linux == nil {
		return "", errors.New("container spec has no linux section")
	}
	return CgroupFromSpec(spec.Linux.CgroupsPath)
}

// OutsideSlot is the container's cgroup for the cgroup of its main
// process: that thread may sit in one of the container's slots (a runtime
// places its threads, and the main one may run invocations too), and
// serving the slot as the container would make slots inside a slot, with
// the slot's quota as the container's limit.
func OutsideSlot(p string) string {
	if _, ok := cgroup.ParseSlotName(path.Base(p)); ok {
		return path.Dir(p)
	}
	return p
}

func (s *Source) containerd() (*containerd.Client, error) {
	s.ctrdMu.Lock()
	defer s.ctrdMu.Unlock()
	if s.ctrd != nil {
		return s.ctrd, nil
	}
	c, err := containerd.New(s.cfg.ContainerdSocket, containerd.WithDefaultNamespace(s.cfg.ContainerdNamespace), containerd.WithTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connecting to containerd at %s: %w", s.cfg.ContainerdSocket, err)
	}
	s.ctrd = c
	return c, nil
}

// resetContainerd drops the connection after a failure, so a restarted
// containerd is reached afresh.
func (s *Source) resetContainerd() {
	s.ctrdMu.Lock()
	defer s.ctrdMu.Unlock()
	if s.ctrd != nil {
		s.ctrd.Close()
		s.ctrd = nil
	}
}

// Stalled names the pod worker when serving one pod has not ended within
// limit (health.Checker): no other pod is served meanwhile.
func (s *Source) Stalled(now time.Time, limit time.Duration) error {
	return s.worker.Stalled(now, limit)
}
