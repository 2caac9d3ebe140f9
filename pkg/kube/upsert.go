package kube

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TypedClient is what client-go's typed clients offer for one kind.
type TypedClient[T any] interface {
	Create(context.Context, T, metav1.CreateOptions) (T, error)
	Update(context.Context, T, metav1.UpdateOptions) (T, error)
	Get(context.Context, string, metav1.GetOptions) (T, error)
}

// Upsert creates obj, or updates the existing one to it (what an install
// does that brings an older one to this version).
func Upsert[T metav1.Object](ctx context.Context, c TypedClient[T], obj T, kind string) error {
	_, err := c.Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var old T
		if old, err = c.Get(ctx, obj.GetName(), metav1.GetOptions{}); err == nil {
			obj.SetResourceVersion(old.GetResourceVersion())
			_, err = c.Update(ctx, obj, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("install %s %s: %w", kind, obj.GetName(), err)
	}
	return nil
}
