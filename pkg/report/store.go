package report

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Labels and keys of record ConfigMaps.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "kubectl-migrate"
	RecordLabel    = "migrate.ms2m.io/record"
	StrategyLabel  = "migrate.ms2m.io/strategy"
	PodLabel       = "migrate.ms2m.io/pod"
	recordKey      = "record.json"
	journalKey     = "journal.json"
	namePrefix     = "kubectl-migrate-"
)

// ErrNotFound is returned by Get for an ID no record has.
var ErrNotFound = errors.New("no such migration")

// Store keeps records as ConfigMaps.
type Store struct {
	Client kubernetes.Interface
}

// Save creates or replaces the record's ConfigMap in its namespace.
func (s Store) Save(ctx context.Context, r *Record) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      namePrefix + r.ID,
			Namespace: r.Namespace,
			Labels: map[string]string{
				ManagedByLabel: ManagedBy,
				RecordLabel:    "v1",
				StrategyLabel:  r.Strategy,
				PodLabel:       truncateLabel(r.Pod),
			},
		},
		Data: map[string]string{recordKey: string(data)},
	}
	if len(r.Journal) > 0 {
		cm.Data[journalKey] = string(r.Journal)
	}
	cms := s.Client.CoreV1().ConfigMaps(r.Namespace)
	_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("save migration record %s: %w", r.ID, err)
	}
	return nil
}

// List returns the records in namespace ("" for all namespaces), newest first.
func (s Store) List(ctx context.Context, namespace string) ([]*Record, error) {
	list, err := s.Client.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{LabelSelector: RecordLabel})
	if err != nil {
		return nil, fmt.Errorf("list migration records: %w", err)
	}
	records := make([]*Record, 0, len(list.Items))
	for i := range list.Items {
		r, err := decode(&list.Items[i])
		if err != nil {
			continue // a damaged record must not hide the others
		}
		records = append(records, r)
	}
	sort.Slice(records, func(i, j int) bool { return records[i].StartedAt.After(records[j].StartedAt) })
	return records, nil
}

// Get returns the record with id (or a unique prefix of it).
func (s Store) Get(ctx context.Context, namespace, id string) (*Record, error) {
	records, err := s.List(ctx, namespace)
	if err != nil {
		return nil, err
	}
	var found []*Record
	for _, r := range records {
		if r.ID == id {
			return r, nil
		}
		if len(id) >= 3 && len(r.ID) > len(id) && r.ID[:len(id)] == id {
			found = append(found, r)
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("%w: %q in %s; list them with kubectl migrate report", ErrNotFound, id, nsDescription(namespace))
	case 1:
		return found[0], nil
	}
	return nil, fmt.Errorf("%q matches %d migrations; give more of the ID", id, len(found))
}

func decode(cm *corev1.ConfigMap) (*Record, error) {
	var r Record
	if err := json.Unmarshal([]byte(cm.Data[recordKey]), &r); err != nil {
		return nil, err
	}
	if j := cm.Data[journalKey]; j != "" {
		r.Journal = json.RawMessage(j)
	}
	return &r, nil
}

func nsDescription(ns string) string {
	if ns == "" {
		return "any namespace"
	}
	return "namespace " + ns
}

func truncateLabel(v string) string {
	if len(v) > 63 {
		return v[:63]
	}
	return v
}
