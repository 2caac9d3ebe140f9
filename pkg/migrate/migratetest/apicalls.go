package migratetest

import (
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The API calls the engine makes, as a test may list them.

// APICall is one request made of the API server.
type APICall struct {
	Group, Verb, Resource, Subresource, Namespace string
}

// Recording returns a clientset that hands every request to target and
// records it, and a function that returns the requests recorded so far.
func Recording(target *fake.Clientset) (*fake.Clientset, func() []APICall) {
	var mu sync.Mutex
	var calls []APICall
	recording := &fake.Clientset{}
	record := func(a k8stesting.Action) {
		mu.Lock()
		defer mu.Unlock()
		r := a.GetResource()
		calls = append(calls, APICall{Group: r.Group, Verb: a.GetVerb(), Resource: r.Resource, Subresource: a.GetSubresource(), Namespace: a.GetNamespace()})
	}
	recording.AddReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		record(a)
		obj, err := target.Invokes(a, nil)
		return true, obj, err
	})
	recording.AddWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		record(a)
		watcher, err := target.InvokesWatch(a)
		return true, watcher, err
	})
	return recording, func() []APICall {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
}

// recordEngineCalls makes the engine's client, which records every
// request (the world's own kubelets and controllers use the world's
// client, unrecorded).
func (w *World) recordEngineCalls() {
	w.engine, w.engineCalls = Recording(w.Client)
}

// APICalls returns the requests the engine made so far.
func (w *World) APICalls() []APICall { return w.engineCalls() }
