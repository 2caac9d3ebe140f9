package migrate

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// A journal is a ConfigMap of the application's namespace, which its
// editors may rewrite, while a recovery acts with its operator's rights.
// Each journal is signed (HMAC-SHA256) with a key kept in the agents'
// namespace, out of the editors' reach: a recovery refuses a journal whose
// signature does not hold, so an editor can neither forge one nor flip a
// flag of a real one (whether the migration had committed, for one).

// JournalKeySecret holds the key, under journalKeyField, in the agents'
// namespace.
const JournalKeySecret = "kubectl-migrate-journal-key"

const journalKeyField = "key"

// JournalKeyIn returns the journal key of the agents' namespace, creating
// it (and the namespace) on first use.
func JournalKeyIn(client kubernetes.Interface, namespace string) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		secrets := client.CoreV1().Secrets(namespace)
		s, err := secrets.Get(ctx, JournalKeySecret, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			key := make([]byte, 32)
			_, _ = rand.Read(key)
			fresh := &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: JournalKeySecret, Namespace: namespace, Labels: map[string]string{kube.ManagedByLabel: kube.ManagedBy}},
				Data:       map[string][]byte{journalKeyField: key},
			}
			// Another migration may make it first: then its key is kept.
			err = agent.CreateInNamespace(ctx, client, namespace, func() (err error) {
				s, _, err = kube.EnsureSecret(ctx, client, fresh)
				return err
			})
		}
		if err != nil {
			return nil, fmt.Errorf("the journal key (Secret %s in namespace %s): %w", JournalKeySecret, namespace, err)
		}
		if key := s.Data[journalKeyField]; len(key) >= 32 {
			return key, nil
		}
		return nil, fmt.Errorf("the journal key (Secret %s in namespace %s) holds no %q of 32 bytes or more", JournalKeySecret, namespace, journalKeyField)
	}
}

// journalMAC is the signature of r's journal: of its namespace and ID too,
// so that it cannot be moved to another record.
func journalMAC(key []byte, r *report.Record) []byte {
	mac := hmac.New(sha256.New, key)
	for _, part := range [][]byte{[]byte(r.Namespace), []byte(r.ID), r.Journal} {
		fmt.Fprintf(mac, "%d:", len(part))
		mac.Write(part)
	}
	return mac.Sum(nil)
}

// checkJournalSigned refuses r's journal unless key signed it.
func checkJournalSigned(key []byte, r *report.Record) error {
	got, err := hex.DecodeString(r.JournalMAC)
	if err != nil || !hmac.Equal(got, journalMAC(key, r)) {
		return fmt.Errorf("migration %s: refusing its journal, which %s did not write as it is (its signature does not hold): anyone who may edit ConfigMaps in namespace %s can change it; nothing was changed: remove what the migration left by hand", r.ID, version.Command(), r.Namespace)
	}
	return nil
}
