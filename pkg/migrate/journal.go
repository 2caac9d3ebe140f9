package migrate

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// Journal is what a migration's record keeps beside its timings for as long
// as the migration may need finishing or undoing: its configuration (the
// broker URL without its password) and its State.
type Journal struct {
	Config Config `json:"config"`
	State  *State `json:"state"`
}

// journal saves a migration's Journal with its record.
type journal struct {
	// config is the migration's own: what preflight settled (a restore
	// through the kubectl-migrate runtime sends directly) is what a
	// recovery must act on.
	config *Config
	state  *State
	record *report.Record
	store  RecordStore
	// key signs each save (Deps.JournalKey), read once.
	key    func(context.Context) ([]byte, error)
	keyVal []byte
}

// saveBackoff rides out a short API server outage; a journal that cannot be
// written stops the step it was to precede.
var saveBackoff = wait.Backoff{Steps: 6, Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1}

func (j *journal) save(ctx context.Context) error {
	data, err := json.Marshal(Journal{Config: redactConfig(*j.config), State: j.state.forJournal()})
	if err != nil {
		return err
	}
	if j.keyVal == nil {
		if j.key == nil {
			return errors.New("write the migration's journal: no journal key to sign it with")
		}
		if j.keyVal, err = j.key(ctx); err != nil {
			return fmt.Errorf("write the migration's journal: %w", err)
		}
	}
	j.record.Journal = data
	j.record.JournalMAC = hex.EncodeToString(journalMAC(j.keyVal, j.record))
	// A refusal (RBAC, admission) will not pass on a retry; an outage may.
	refused := func(err error) bool {
		return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
			errors.Is(err, report.ErrChanged)
	}
	err = retry.OnError(saveBackoff, func(err error) bool { return ctx.Err() == nil && !refused(err) }, func() error {
		return j.store.Save(ctx, j.record)
	})
	if err != nil {
		return fmt.Errorf("write the migration's journal: %w", err)
	}
	return nil
}

// lastApplied is the annotation kubectl apply keeps a copy of the object in.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// forJournal is s with its saved objects stripped of what recovery never
// needs and a journal reader should not see: managed fields and kubectl's
// last-applied copy (which may carry what the live object no longer does).
func (s *State) forJournal() *State {
	if s == nil {
		return nil
	}
	c := *s
	strip := func(o metav1.Object) {
		o.SetManagedFields(nil)
		a := o.GetAnnotations()
		if a[lastApplied] == "" && a[BrokerURLAnnotation] == "" {
			return
		}
		a = maps.Clone(a)
		delete(a, lastApplied)
		if u, ok := a[BrokerURLAnnotation]; ok {
			a[BrokerURLAnnotation] = redactURL(u)
		}
		o.SetAnnotations(a)
	}
	c.Source, c.Target, c.SavedSTS = c.Source.DeepCopy(), c.Target.DeepCopy(), c.SavedSTS.DeepCopy()
	for _, o := range c.savedObjects() {
		strip(o)
	}
	c.Final = s.Final.forJournal()
	return &c
}

// savedObjects are the objects s keeps a copy of (not its Final's): the
// source and target pods, the StatefulSet and its pod template.
func (s *State) savedObjects() []metav1.Object {
	var objects []metav1.Object
	for _, p := range []*corev1.Pod{s.Source, s.Target} {
		if p != nil {
			objects = append(objects, p)
		}
	}
	if s.SavedSTS != nil {
		objects = append(objects, s.SavedSTS, &s.SavedSTS.Spec.Template)
	}
	return objects
}

// redactConfig keeps the broker's password out of the journal; recovery
// reads it from the pod's annotation or --broker-url again.
func redactConfig(c Config) Config {
	c.Broker.URL = redactURL(c.Broker.URL)
	return c
}

// redactURL is a broker URL without its password ("" if it cannot be
// parsed, which may hide one).
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return ""
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "")
	}
	return u.String()
}

// withPassword is the journal's redacted broker URL annotation value with
// the password of brokerURL (recovery's) put back, when both name the same
// user: a pod or StatefulSet recovery creates again gets its annotation as
// it was.
func withPassword(redacted, brokerURL string) string {
	r, err := url.Parse(redacted)
	b, berr := url.Parse(brokerURL)
	if err != nil || berr != nil || r.User == nil || b.User == nil || r.User.Username() != b.User.Username() {
		return redacted
	}
	if pw, ok := b.User.Password(); ok {
		r.User = url.UserPassword(r.User.Username(), pw)
	}
	return r.String()
}

// LiveBrokerURL is the broker URL, password included, that a recovery of
// j dials when not given one: the annotation of a live object of the
// migration (its pods, its StatefulSet's template) that names the same
// user and host as the journal's URL, which keeps no password. "" if none
// does.
func LiveBrokerURL(ctx context.Context, client kubernetes.Interface, j Journal) string {
	want, err := url.Parse(j.Config.Broker.URL)
	if err != nil || want.User == nil {
		return ""
	}
	var annotated []string
	for _, name := range []string{j.Config.Pod, j.Config.TargetName, ShadowName(j.Config.Pod)} {
		if pod, err := client.CoreV1().Pods(j.Config.Namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
			annotated = append(annotated, pod.Annotations[BrokerURLAnnotation])
		}
	}
	if j.Config.StatefulSet != "" {
		if sts, err := client.AppsV1().StatefulSets(j.Config.Namespace).Get(ctx, j.Config.StatefulSet, metav1.GetOptions{}); err == nil {
			annotated = append(annotated, sts.Spec.Template.Annotations[BrokerURLAnnotation])
		}
	}
	for _, a := range annotated {
		u, err := url.Parse(a)
		if err != nil || u.User == nil || u.Host != want.Host || u.User.Username() != want.User.Username() {
			continue // not the broker the migration used
		}
		if _, ok := u.User.Password(); ok {
			return withPassword(j.Config.Broker.URL, a)
		}
	}
	return ""
}

// restorePasswords puts brokerURL's password back into the broker URL
// annotations of what the journal saved (the journal keeps none).
func (s *State) restorePasswords(brokerURL string) {
	for ; s != nil; s = s.Final {
		for _, o := range s.savedObjects() {
			if a := o.GetAnnotations(); a[BrokerURLAnnotation] != "" {
				a[BrokerURLAnnotation] = withPassword(a[BrokerURLAnnotation], brokerURL)
			}
		}
	}
}

// ReadJournal decodes a record's journal; ok is false when the record keeps
// none (the migration ended, or it predates journals).
func ReadJournal(r *report.Record) (j Journal, ok bool, err error) {
	if len(r.Journal) == 0 {
		return Journal{}, false, nil
	}
	if err := json.Unmarshal(r.Journal, &j); err != nil {
		return Journal{}, false, fmt.Errorf("migration %s: unreadable journal: %w", r.ID, err)
	}
	if j.State == nil {
		return Journal{}, false, fmt.Errorf("migration %s: the journal holds no state", r.ID)
	}
	if err := j.verify(r); err != nil {
		return Journal{}, false, fmt.Errorf("migration %s: refusing its journal, which names %w; it was not written by %s (anyone who may edit ConfigMaps in namespace %s can write one): remove what the migration left by hand", r.ID, err, version.Command(), r.Namespace)
	}
	return j, true, nil
}

// isImageOf reports whether ref is tagged image (repo:tag) itself, or a
// digest of it or of its repository.
func isImageOf(ref, tagged string) bool {
	repo := tagged[:strings.LastIndex(tagged, ":")]
	name, digest, ok := strings.Cut(ref, "@sha256:")
	if !ok {
		return ref == tagged
	}
	return (name == tagged || name == repo) && digest != "" && strings.Trim(digest, "0123456789abcdef") == ""
}

// verify refuses a journal that names anything its migration would never
// touch. Anyone who may edit ConfigMaps in the namespace can write one,
// while recovery acts with its operator's rights: it must not be steered at
// another namespace's objects, another workload's queues, other images or
// files. (Recovery runs its own agent image, whatever the journal says.)
func (j Journal) verify(r *report.Record) error {
	c := j.Config
	if c.ID != r.ID || c.Namespace != r.Namespace || c.Pod != r.Pod {
		return fmt.Errorf("another migration (%s of %s/%s)", c.ID, c.Namespace, c.Pod)
	}
	pods := []string{c.Pod, c.TargetName, ShadowName(c.Pod)}
	for s := j.State; s != nil; s = s.Final {
		pod, tag := c.Pod, c.ID
		if s.Stage != "" {
			tag += "-" + s.Stage
		}
		for _, o := range []*corev1.Pod{s.Source, s.Target} {
			if o != nil && (o.Namespace != c.Namespace || !slices.Contains(pods, o.Name)) {
				return fmt.Errorf("pod %s/%s", o.Namespace, o.Name)
			}
		}
		if s.Source != nil {
			pod = s.Source.Name
		}
		if sts := s.SavedSTS; sts != nil && (sts.Namespace != c.Namespace || sts.Name != c.StatefulSet) {
			return fmt.Errorf("StatefulSet %s/%s", sts.Namespace, sts.Name)
		}
		for q, want := range map[string]string{s.MigrationQueue: protocol.MigrationQueueName(c.Broker.Queue), s.ReplayQueue: protocol.ReplayQueueName(c.Broker.Queue)} {
			if q != "" && q != want {
				return fmt.Errorf("queue %s", q)
			}
		}
		for ctr, path := range s.Archives {
			if ok, _ := filepath.Match(agent.ArchivePattern(c.Namespace, pod, ctr), path); !ok {
				return fmt.Errorf("archive %s", path)
			}
		}
		for ctr, ref := range s.Images {
			// Staged for one of the migration's pods: a shadow's final
			// stage restores the pod under its own name.
			staged := slices.ContainsFunc(pods, func(p string) bool {
				return ref == agent.StagedPath(ociruntime.Identity{Namespace: c.Namespace, Pod: p, Container: ctr})
			})
			if !staged && !isImageOf(ref, c.CheckpointImageOf(pod, ctr, tag)) {
				return fmt.Errorf("image %s", ref)
			}
		}
	}
	return nil
}
