package kubernetes

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestShutdownFlushesEvents: Events recorded just before the agent exits
// reach the API server: Shutdown waits for them before it stops the
// broadcaster, which would drop what it has not sent yet.
func TestShutdownFlushesEvents(t *testing.T) {
	cs := fake.NewSimpleClientset()
	s := New(Config{NodeName: "node-1"}, cs, nil, slog.New(slog.DiscardHandler))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "fn", Name: "rt-1", UID: "uid-1"}}
	const n = 5
	for i := range n {
		s.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonPrepareFailed, "failure %d", i)
	}
	s.Shutdown(time.Minute)
	evs, err := cs.CoreV1().Events("fn").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != n {
		var got []string
		for _, e := range evs.Items {
			got = append(got, e.Message)
		}
		t.Fatalf("%d Events reached the API server after Shutdown, want %d: %v", len(evs.Items), n, got)
	}
	for i := range n {
		found := false
		for _, e := range evs.Items {
			found = found || e.Message == fmt.Sprintf("failure %d", i)
		}
		if !found {
			t.Errorf("Event %q lost", fmt.Sprintf("failure %d", i))
		}
	}
}
