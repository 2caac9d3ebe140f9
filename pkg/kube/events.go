package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// EventController names kubectl-migrate as the reporter of its Events.
const EventController = "kubectl-migrate.io/kubectl-migrate"

// PodEvents writes Events about pods, as kubectl describe pod shows them,
// in order and off the caller's path (a migration's critical path must not
// wait for them); Close waits until the queued ones are written. An Event
// the API server refuses as forbidden ends the writing: they are a
// courtesy, never a reason to fail.
type PodEvents struct {
	client   kubernetes.Interface
	instance string
	queue    chan *eventsv1.Event
	done     chan struct{}
	mu       sync.Mutex // guards queue's closing against a late Record
	closed   bool
}

// NewPodEvents starts the writer; instance names the process that reports
// (a migration's ID, say).
func NewPodEvents(client kubernetes.Interface, instance string) *PodEvents {
	e := &PodEvents{client: client, instance: instance, queue: make(chan *eventsv1.Event, 64), done: make(chan struct{})}
	go e.write()
	return e
}

func (e *PodEvents) write() {
	defer close(e.done)
	failed := false
	for ev := range e.queue {
		if failed {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := e.client.EventsV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
		cancel()
		failed = apierrors.IsForbidden(err) // the rest would be refused too

	}
}

// Record queues an Event about pod (nil, or one not created yet, has none);
// eventType is corev1.EventTypeNormal or EventTypeWarning. A full queue
// drops it.
func (e *PodEvents) Record(pod *corev1.Pod, eventType, reason, action, note string) {
	if e == nil || pod == nil || pod.UID == "" {
		return
	}
	now := time.Now()
	const maxNote = 1024 // the API server's limit
	if len(note) > maxNote {
		note = note[:maxNote-3] + "..."
	}
	ev := &eventsv1.Event{
		// Named as client-go's recorders name theirs: the object's name and
		// the time.
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod.Name, now.UnixNano()), Namespace: pod.Namespace},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: EventController,
		ReportingInstance:   e.instance,
		Action:              action,
		Reason:              reason,
		Note:                note,
		Type:                eventType,
		Regarding:           corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	select {
	case e.queue <- ev:
	default:
	}
}

// Close stops taking Events and waits, within ctx, until the queued ones
// are written.
func (e *PodEvents) Close(ctx context.Context) {
	if e == nil {
		return
	}
	e.mu.Lock()
	if !e.closed {
		e.closed = true
		close(e.queue)
	}
	e.mu.Unlock()
	select {
	case <-e.done:
	case <-ctx.Done():
	}
}
