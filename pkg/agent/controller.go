package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
)

// ControllerName names the agents' controller: its Deployment, service
// account and the source of its Events.
const ControllerName = "kubectl-migrate-controller"

// Controller builds the agent pods that migrations request (AgentRequest)
// in its namespace, and nothing else.
type Controller struct {
	Client    kubernetes.Interface
	Namespace string
	// Image is the agents' image, the administrator's: every request must
	// name it.
	Image string
	// PolicySince returns when the admission policy that vets requests
	// (RequestPolicy) came into force, or why it is not: without it any
	// request could name any namespace, so none is served, nor one made
	// before it.
	PolicySince func(context.Context) (time.Time, error)
	// Identity names this replica in the controller's lease (its pod;
	// ControllerName when unset).
	Identity string
}

// leaseDuration is how long the controller's lease holds unrenewed: a
// second replica takes over after it, and a migration's preflight
// (CheckController) finds no controller once it has passed.
const leaseDuration = 15 * time.Second

// Run serves requests while it holds the controller's Lease, until ctx
// ends. The lease keeps a second replica from serving the same requests
// and tells migrations that a controller runs before they ask it for
// anything.
func (c Controller) Run(ctx context.Context) error {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: ControllerName, Namespace: c.Namespace},
			Client:     c.Client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: cmp.Or(c.Identity, ControllerName)},
		},
		Name:            ControllerName,
		LeaseDuration:   leaseDuration,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				if err := c.serveRequests(ctx); err != nil {
					stop(err)
				}
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return err
	}
	elector.Run(ctx)
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if ctx.Err() == nil {
		// Restarted, it waits for the lease again.
		return errors.New("lost the controller's lease")
	}
	return nil
}

// serveRequests serves requests until ctx ends.
func (c Controller) serveRequests(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 10*time.Minute,
		informers.WithNamespace(c.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("type", string(RequestType)).String()
		}))
	secrets := factory.Core().V1().Secrets()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: ControllerName})
	defer queue.ShutDown()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	// Added only: a request is served once (its data cannot change), and a
	// resync must not start again an agent that ended.
	if _, err := secrets.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue}); err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.Client.CoreV1().Events(c.Namespace)})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: ControllerName})

	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), secrets.Informer().HasSynced) {
		return ctx.Err()
	}
	log.Printf("serving agent requests in %s with image %s", c.Namespace, c.Image)
	lister := secrets.Lister()
	// Two workers: a migration asks for its agents on both nodes at once.
	for range 2 {
		go wait.UntilWithContext(ctx, func(ctx context.Context) {
			for c.next(ctx, queue, lister, recorder) {
			}
		}, time.Second)
	}
	<-ctx.Done()
	return nil
}

// next handles one queued request; false once the queue is shut down.
func (c Controller) next(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string], lister listerscorev1.SecretLister, recorder record.EventRecorder) bool {
	key, quit := queue.Get()
	if quit {
		return false
	}
	defer queue.Done(key)
	_, name, _ := cache.SplitMetaNamespaceKey(key)
	s, err := lister.Secrets(c.Namespace).Get(name)
	if apierrors.IsNotFound(err) {
		queue.Forget(key)
		return true
	}
	if err == nil {
		err = c.serve(ctx, s)
	}
	var refused refusal
	switch {
	case err == nil:
		queue.Forget(key)
	case errors.As(err, &refused):
		queue.Forget(key)
		recorder.Event(s, corev1.EventTypeWarning, "Refused", refused.Error())
		log.Printf("refused request %s: %v", name, refused)
	default:
		utilruntime.HandleErrorWithContext(ctx, err, "agent request", "request", name)
		queue.AddRateLimited(key)
	}
	return true
}

// refusal is a request the controller will never serve.
type refusal struct{ error }

// serve creates the pod request s asks for.
func (c Controller) serve(ctx context.Context, s *corev1.Secret) error {
	if s.DeletionTimestamp != nil || s.Type != RequestType {
		return nil // not every client honours the field selector
	}
	since, err := c.PolicySince(ctx)
	if err != nil {
		return refusal{fmt.Errorf("no agent is started while the admission policy that checks who asks is missing: %w", err)}
	}
	if s.CreationTimestamp.Time.Before(since.Truncate(time.Second)) {
		return refusal{fmt.Errorf("request %s was made before the admission policy that checks who asks (%s)", s.Name, since.Format(time.RFC3339))}
	}
	req, appNamespace, err := ParseRequest(s)
	if err == nil {
		err = req.Validate(c.Image)
	}
	if err != nil {
		return refusal{fmt.Errorf("request %s: %w", s.Name, err)}
	}
	_, err = c.Client.CoreV1().Pods(c.Namespace).Create(ctx, RequestedPod(s, req, appNamespace), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// CheckController tells whether the agents' controller serves requests in
// namespace, from the lease it renews, so that a migration without one
// stops before it changes anything instead of waiting for agents nobody
// starts. now is the caller's clock; skew up to a lease's length is
// forgiven.
func CheckController(ctx context.Context, client kubernetes.Interface, namespace string, now time.Time) error {
	lease, err := client.CoordinationV1().Leases(namespace).Get(ctx, ControllerName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("the agents' controller has never run in namespace %s: have an administrator install it with kubectl migrate node-setup --agents-only", namespace)
	}
	if err != nil {
		return fmt.Errorf("read the agents' controller's lease %s/%s: %w", namespace, ControllerName, err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	var renewed time.Time
	if lease.Spec.RenewTime != nil {
		renewed = lease.Spec.RenewTime.Time
	}
	held := time.Duration(ptr.Deref(lease.Spec.LeaseDurationSeconds, 0)) * time.Second
	if holder == "" || now.After(renewed.Add(held+leaseDuration)) {
		return fmt.Errorf("the agents' controller in namespace %s is not running (its lease was last renewed %s): have an administrator check it (kubectl -n %s get deployment %s) or install it again (kubectl migrate node-setup --agents-only)",
			namespace, renewed.UTC().Format(time.RFC3339), namespace, ControllerName)
	}
	return nil
}
