package migrate

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// scriptedKubelet answers health checks from a script, one answer per
// check, the last one forever.
type scriptedKubelet struct {
	Kubelet
	mu      sync.Mutex
	answers []error
}

func (k *scriptedKubelet) Healthy(context.Context, string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	err := k.answers[0]
	if len(k.answers) > 1 {
		k.answers = k.answers[1:]
	}
	return err
}

// TestKubeletAway: only a kubelet the API server says it cannot reach, for
// the whole timeout, is away; an answer in between starts the count again,
// and an API server that does not answer itself never counts.
func TestKubeletAway(t *testing.T) {
	t.Parallel()
	unreachable := apierrors.NewServiceUnavailable("error trying to reach service: connection refused")
	apiDown := errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	for _, tc := range []struct {
		name    string
		answers []error
		away    bool
	}{
		{"unreachable", []error{unreachable}, true},
		{"back in between", []error{unreachable, unreachable, nil, unreachable, nil}, false},
		{"the API server down", []error{apiDown}, false},
		{"forbidden", []error{apierrors.NewForbidden(schema.GroupResource{Resource: "nodes/proxy"}, "node-b", errors.New("RBAC"))}, false},
		{"healthy", []error{nil}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Migration{config: Config{KubeletTimeout: 200 * time.Millisecond}, deps: Deps{Kubelet: &scriptedKubelet{answers: tc.answers}}}
			ctx, cancel := context.WithTimeout(context.Background(), 3*m.config.KubeletTimeout)
			defer cancel()
			select {
			case err := <-m.kubeletAway(ctx, "node-b"):
				if !tc.away {
					t.Fatalf("away: %v", err)
				}
			case <-ctx.Done():
				if tc.away {
					t.Fatal("never reported away")
				}
			}
		})
	}
}
