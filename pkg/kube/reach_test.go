package kube

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Any answer of the API server, a refusal included (a migrator need not
// read namespaces), means it is there; no answer is an error naming
// kubectl cluster-info.
func TestReach(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  error
		reached bool
	}{
		{"the namespace", nil, true},
		{"forbidden", apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "shop", errors.New("RBAC")), true},
		{"not found", apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "shop"), true},
		{"connection refused", errors.New(`Get "https://127.0.0.1:1/api/v1/namespaces/shop": dial tcp 127.0.0.1:1: connect: connection refused`), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			client.PrependReactor("get", "namespaces", func(k8stesting.Action) (bool, runtime.Object, error) {
				return tc.answer != nil, nil, tc.answer
			})
			err := Reach(context.Background(), client, "shop", time.Second)
			if (err == nil) != tc.reached || (err != nil && !strings.Contains(err.Error(), "kubectl cluster-info")) {
				t.Fatalf("Reach: %v, want reached %v", err, tc.reached)
			}
		})
	}
}
