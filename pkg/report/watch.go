package report

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// Watch calls seen with r's record as it is now and each time its
// migration saves it again, until seen returns true, the record is
// deleted, or ctx ends.
func (s Store) Watch(ctx context.Context, r *Record, seen func(*Record) bool) error {
	name := namePrefix + r.ID
	cms := s.Client.CoreV1().ConfigMaps(r.Namespace)
	only := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = only
			return cms.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = only
			return cms.Watch(ctx, o)
		},
	}, s.Client) // a fake client's watch cannot stream the list
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.ConfigMap{}, nil, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, fmt.Errorf("the record of migration %s was deleted", r.ID)
		}
		cm, ok := ev.Object.(*corev1.ConfigMap)
		if !ok || cm.Name != name {
			return false, nil
		}
		rec, err := decode(cm)
		if err != nil {
			return false, fmt.Errorf("record %s: %w", name, err)
		}
		return seen(rec), nil
	})
	return err
}
