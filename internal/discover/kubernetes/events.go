package kubernetes

// Events go out through client-go's broadcaster, asynchronously: Shutdown
// waits for those recorded so far before it stops it, so that the Events
// of an agent's last moments are not lost on exit.

import (
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// events counts Events recorded and Events handed to the API server.
type events struct {
	b                 record.EventBroadcaster
	recorded, written atomic.Int64
}

// countingRecorder counts each Event it records.
type countingRecorder struct {
	record.EventRecorder
	ev *events
}

func (r countingRecorder) Event(o runtime.Object, eventtype, reason, message string) {
	r.ev.recorded.Add(1)
	r.EventRecorder.Event(o, eventtype, reason, message)
}

func (r countingRecorder) Eventf(o runtime.Object, eventtype, reason, format string, args ...any) {
	r.ev.recorded.Add(1)
	r.EventRecorder.Eventf(o, eventtype, reason, format, args...)
}

func (r countingRecorder) AnnotatedEventf(o runtime.Object, annotations map[string]string, eventtype, reason, format string, args ...any) {
	r.ev.recorded.Add(1)
	r.EventRecorder.AnnotatedEventf(o, annotations, eventtype, reason, format, args...)
}

// countingSink counts each write to the API server, failed or not (a
// failed one the broadcaster retries later, which Shutdown does not wait
// for).
type countingSink struct {
	record.EventSink
	ev *events
}

func (s countingSink) Create(e *corev1.Event) (*corev1.Event, error) {
	defer s.ev.written.Add(1)
	return s.EventSink.Create(e)
}

func (s countingSink) Update(e *corev1.Event) (*corev1.Event, error) {
	defer s.ev.written.Add(1)
	return s.EventSink.Update(e)
}

func (s countingSink) Patch(old *corev1.Event, data []byte) (*corev1.Event, error) {
	defer s.ev.written.Add(1)
	return s.EventSink.Patch(old, data)
}

// Shutdown waits, at most timeout, until every Event recorded so far has
// been written to the API server, then stops the broadcaster. An Event the
// broadcaster drops (its spam filter, a full queue) is waited for until
// the timeout.
func (s *Source) Shutdown(timeout time.Duration) {
	for deadline := time.Now().Add(timeout); s.events.written.Load() < s.events.recorded.Load() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	s.events.b.Shutdown()
}
