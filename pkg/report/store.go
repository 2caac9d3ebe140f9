package report

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Labels and keys of record ConfigMaps.
const (
	ManagedByLabel = kube.ManagedByLabel
	ManagedBy      = kube.ManagedBy
	RecordLabel    = "migrate.ms2m.io/record"
	StrategyLabel  = "migrate.ms2m.io/strategy"
	PodLabel       = "migrate.ms2m.io/pod"
	recordKey      = "record.json"
	journalKey     = "journal.json"
	journalMACKey  = "journal.mac"
	namePrefix     = "kubectl-migrate-"
)

// ErrNotFound is returned by Get for an ID no record has.
var ErrNotFound = errors.New("no such migration")

// Store keeps records as ConfigMaps.
type Store struct {
	Client kubernetes.Interface
}

// ErrChanged is returned by Save when the stored record changed since it
// was read or written through r: another process (say, the migration's
// recovery) works on it now.
var ErrChanged = errors.New("the migration's record was changed by another process")

// Save creates the record's ConfigMap in its namespace or, for a record read
// or written before, replaces it if it has not changed since (optimistic
// concurrency: two processes never overwrite each other's journal).
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
			ResourceVersion: r.ResourceVersion,
		},
		Data: map[string]string{recordKey: string(data)},
	}
	if len(r.Journal) > 0 {
		cm.Data[journalKey] = string(r.Journal)
		cm.Data[journalMACKey] = r.JournalMAC
	}
	cms := s.Client.CoreV1().ConfigMaps(r.Namespace)
	var saved *corev1.ConfigMap
	if r.ResourceVersion == "" {
		saved, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			saved, err = s.replaceOwnCreate(ctx, cm, r)
		}
	} else {
		saved, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if apierrors.IsConflict(err) {
		err = fmt.Errorf("%w (%v)", ErrChanged, err)
	}
	if err != nil {
		return fmt.Errorf("save migration record %s: %w", r.ID, err)
	}
	r.ResourceVersion = saved.ResourceVersion
	return nil
}

// replaceOwnCreate handles a create that reached the API server although
// its answer did not reach us (a retry then finds the record there): the
// stored record is ours if it started when ours did.
func (s Store) replaceOwnCreate(ctx context.Context, cm *corev1.ConfigMap, r *Record) (*corev1.ConfigMap, error) {
	cms := s.Client.CoreV1().ConfigMaps(r.Namespace)
	stored, err := cms.Get(ctx, cm.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if old, err := decode(stored); err != nil || !old.StartedAt.Equal(r.StartedAt) || old.Pod != r.Pod {
		return nil, fmt.Errorf("%w: %s exists and is not this migration's", ErrChanged, cm.Name)
	}
	cm.ResourceVersion = stored.ResourceVersion
	return cms.Update(ctx, cm, metav1.UpdateOptions{})
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
		return nil, fmt.Errorf("%w: %q in %s; list them with %s report", ErrNotFound, id, nsDescription(namespace), version.Command())
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
		r.JournalMAC = cm.Data[journalMACKey]
	}
	if r.Namespace != cm.Namespace {
		// Written by hand to steer whoever reads it at another namespace.
		return nil, fmt.Errorf("record %s in namespace %s names namespace %s", cm.Name, cm.Namespace, r.Namespace)
	}
	r.ResourceVersion = cm.ResourceVersion
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
