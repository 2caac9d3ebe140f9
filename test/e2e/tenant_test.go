//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/check"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// TestCheckpointRunByAnotherNamespaceNeverConsumes: after a migration, a pod
// of another namespace pinned to the target node names the checkpoint image
// (all it takes for the runtime to restore the victim's process into it).
// The restored copy finds itself in a pod no migration named, holds for
// good and consumes nothing: the victim conserves every message.
//
// The lab's registry takes anonymous pulls, so the kubelet lets any pod use
// the image once on the node; TestACheckpointSentDirectRunsOnlyInItsPod is
// the same attack where the image came with the restored pod's own secret.
func TestCheckpointRunByAnotherNamespaceNeverConsumes(t *testing.T) {
	concurrent(t)
	l, w, rec := migrateLivePod(t)
	thief := startThief(t, l, w, rec)
	ctx := context.Background()
	// The runtime restores the victim's process into the thief's pod; once
	// it has reconnected it knows where it runs.
	st := thiefRunsTheVictim(t, w, thief, rec)
	if st.Foreign != thief.Namespace+"/thief" || st.Mode != protocol.ModeHold {
		t.Fatalf("the copy in another namespace's pod does not hold as foreign: %+v", st)
	}
	if _, err := thief.Control(ctx, "thief", protocol.Control{Type: protocol.Resume}); err == nil {
		t.Fatal("the foreign copy obeyed RESUME")
	}
	// Whatever it consumed, the victim would lack.
	checkConservation(t, w, rec.TargetPod)
	if after, err := thief.State(ctx, "thief"); err != nil || after.Position() != st.Position() || after.Mode != protocol.ModeHold {
		t.Fatalf("the foreign copy moved from %s: %+v (%v)", st.Position(), after, err)
	}
}

// thiefRunsTheVictim waits until the copy in the thief's pod has
// reconnected (it then knows where it runs), checks that it is the
// victim's process, and returns its state.
func thiefRunsTheVictim(t *testing.T, w, thief *workload.Workload, rec report.Record) protocol.State {
	t.Helper()
	st, err := thief.WaitFor(context.Background(), "thief", 2*time.Minute, func(st protocol.State) bool { return st.Reconnects > 0 })
	if err != nil {
		t.Fatalf("the thief's copy never answered: %v (%+v)", err, st)
	}
	t.Logf("the thief's pod runs the victim's process %s: mode %s, foreign %q, homes %v", st.Process, st.Mode, st.Foreign, st.Homes)
	if victim := state(t, w, rec.TargetPod); st.Process != victim.Process {
		t.Fatalf("the thief's pod runs process %s, not the victim's %s: the runtime did not restore the checkpoint, so this proves nothing", st.Process, victim.Process)
	}
	return st
}

// startThief starts, in a new namespace, a pod pinned to the target node
// that names rec's checkpoint image, as a tenant who read the image's name
// (node.status.images lists it) would, with forge applied to its pod
// before it is created; it returns the thief's workload.
func startThief(t *testing.T, l *lab, w *workload.Workload, rec report.Record, forge ...func(*corev1.Pod)) *workload.Workload {
	t.Helper()
	if len(rec.Images) != 1 {
		t.Fatalf("images %v", rec.Images)
	}
	ctx := context.Background()
	thief := workload.Attach(l.client, fmt.Sprintf("attacker-%06x", rand.Uint32()>>8), w.Exchange, w.Queue)
	thief.Token = w.Token // what the copy in the thief's pod answers to: its memory's
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: thief.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = thief.Delete(context.Background()) })
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "thief", Namespace: thief.Namespace},
		Spec: corev1.PodSpec{
			NodeName: "node-b",
			Containers: []corev1.Container{{
				Name: "consumer", Image: rec.Images[0], ImagePullPolicy: corev1.PullIfNotPresent,
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}},
		},
	}
	// The runtime restores a container only with the mounts it was
	// checkpointed with: the thief mounts a control token of its own where
	// the victim's was (it cannot mount the victim's).
	if _, err := workload.CreateControlToken(ctx, l.client, thief.Namespace); err != nil {
		t.Fatal(err)
	}
	workload.MountControlToken(&pod.Spec)
	for _, f := range forge {
		f(pod)
	}
	// The namespace's default service account appears asynchronously.
	l.waitDefaultServiceAccount(t, thief.Namespace)
	if _, err := l.client.CoreV1().Pods(thief.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return thief
}

// TestACheckpointSentDirectRunsOnlyInItsPod: without a registry, the
// restored pod pulls its checkpoint image from its node's agent with a pull
// secret of its own, so the kubelet (KEP-2535, on in the lab as from 1.35)
// knows the image came with that secret. A pod of another namespace that
// names the image on that node must pull it itself, and cannot: it never
// runs, nothing of the victim's process is restored into it, and the
// victim conserves every message. The restored pod itself, whose secret
// matches, is restored again from the image when its process dies (after
// the conservation check: a restart forgets what the process applied since
// its checkpoint, as any crash of an in-memory consumer does).
//
// The kubelet verifies pull credentials only with runtimes whose pull and
// image status name an image alike (CRI-O from 1.36, the lab's containerd
// 2.3): on the lab's CRI-O 1.34 the thief's pod would run, and the test says
// so instead of failing.
func TestACheckpointSentDirectRunsOnlyInItsPod(t *testing.T) {
	concurrent(t)
	ctx := context.Background()
	skipUnlessTheKubeletVerifiesPulls(t, setup(t))
	l, w, rec := migrateLivePod(t, "--transfer", "direct")
	target, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, rec.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secret := "kubectl-migrate-pull-" + rec.ID + "-node-b"
	if !slices.Contains(target.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: secret}) {
		t.Fatalf("the restored pod pulls with %v, not its own secret %s", target.Spec.ImagePullSecrets, secret)
	}
	thief := startThief(t, l, w, rec)
	thiefRefused(t, l, thief)
	checkConservation(t, w, rec.TargetPod)
	restartsFromItsCheckpoint(t, l, w, rec)
	thiefNeverRan(t, l, thief)
	if err := l.client.CoreV1().Pods(w.Namespace).Delete(ctx, rec.TargetPod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The secret belongs to the pod, and goes with it.
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := l.client.CoreV1().Secrets(w.Namespace).Get(ctx, secret, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("the pull secret %s outlived its pod: %v", secret, err)
	}
}

// TestACheckpointInAPrivateRegistryRunsOnlyInItsPod is the same attack with
// the checkpoint pushed to a registry that asks for credentials, with the
// registry secret the user names (--registry-secret): the restored pod
// pulls with it, so the thief's pod must pull the image itself, and the
// registry refuses it; nor does anyone without credentials read the image
// kept there (--keep-image).
func TestACheckpointInAPrivateRegistryRunsOnlyInItsPod(t *testing.T) {
	concurrent(t)
	ctx := context.Background()
	l := setup(t)
	skipUnlessTheKubeletVerifiesPulls(t, l)
	private := env(t, "LAB_PRIVATE_REGISTRY")
	w := l.deployWith(t, workload.Options{Rate: "10"})
	l.registrySecret(t, w.Namespace, "regcred", private)
	waitApplied(t, w, "consumer", 30)
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--registry", private+"/checkpoints", "--registry-secret", "regcred", "--keep-image")
	if err != nil || rec.Outcome != report.Succeeded {
		t.Fatalf("migration: %v\n%s", err, stderr)
	}
	if len(rec.Images) != 1 || !strings.HasPrefix(rec.Images[0], private+"/checkpoints/"+w.Namespace+"/consumer") {
		t.Fatalf("images %v: not in the private registry", rec.Images)
	}
	var refused *transport.Error
	if _, err := (image.Registry{Insecure: true}).Pull(ctx, rec.Images[0]); !errors.As(err, &refused) || refused.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a pull of the kept checkpoint image without credentials: %v", err)
	}
	thief := startThief(t, l, w, rec)
	thiefRefused(t, l, thief)
	checkConservation(t, w, rec.TargetPod)
	restartsFromItsCheckpoint(t, l, w, rec)
	thiefNeverRan(t, l, thief)
}

// skipUnlessTheKubeletVerifiesPulls skips on nodes whose kubelet cannot
// tell which pull secret brought an image in: it verifies pull credentials
// (KEP-2535) only with runtimes whose pull and image status name an image
// alike (CRI-O from 1.36; the lab's containerd 2.3). On the lab's CRI-O
// 1.34 the thief's pod would run, and the test says so instead of failing.
func skipUnlessTheKubeletVerifiesPulls(t *testing.T, l *lab) {
	t.Helper()
	node, err := l.client.CoreV1().Nodes().Get(context.Background(), "node-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if runtime := node.Status.NodeInfo.ContainerRuntimeVersion; strings.HasPrefix(runtime, "cri-o://1.3") && runtime < "cri-o://1.36" {
		t.Skipf("node-b runs %s, whose image references the kubelet cannot match with its pull records (KEP-2535 needs CRI-O 1.36)", runtime)
	}
}

// thiefRefused waits until the thief's pod is refused its image, failing
// if its container ever runs.
func thiefRefused(t *testing.T, l *lab, thief *workload.Workload) {
	t.Helper()
	var waiting *corev1.ContainerStateWaiting
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := l.client.CoreV1().Pods(thief.Namespace).Get(ctx, "thief", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, nil
		}
		cs := p.Status.ContainerStatuses[0]
		if cs.State.Running != nil || cs.State.Terminated != nil {
			return false, fmt.Errorf("the thief's container ran: %+v", cs.State)
		}
		waiting = cs.State.Waiting
		return kube.PullFailed(waiting), nil
	})
	if err != nil {
		t.Fatalf("the thief's pod was not refused the image: %v (%+v)", err, waiting)
	}
	t.Logf("the thief's pod: %s: %s", waiting.Reason, waiting.Message)
}

// thiefNeverRan checks, later, that the thief's container still never ran.
func thiefNeverRan(t *testing.T, l *lab, thief *workload.Workload) {
	t.Helper()
	p, err := l.client.CoreV1().Pods(thief.Namespace).Get(context.Background(), "thief", metav1.GetOptions{})
	if err != nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running != nil || p.Status.ContainerStatuses[0].LastTerminationState.Terminated != nil {
		t.Fatalf("the thief's pod ran after all: %+v (%v)", p, err)
	}
}

// registrySecret creates a dockerconfigjson secret name in namespace with
// the lab's registry credentials for host.
func (l *lab) registrySecret(t *testing.T, namespace, name, host string) {
	t.Helper()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"` + host + `":{"auth":"ZTJlOmUyZQ=="}}}`)},
	}
	if _, err := l.client.CoreV1().Secrets(namespace).Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestAnotherNamespaceCannotDriveAnAgent: a serving agent (the CRI socket
// mounted, as on a migration's target) is called from a pod of another
// namespace on the same node, over the pod network as any pod can: without
// the migration's token, or with a guessed one, every endpoint refuses
// (401), so the attacker neither reads the runtime's config, nor stops a
// pod, nor removes archives; the migration's own call through the API
// server goes through.
func TestAnotherNamespaceCannotDriveAnAgent(t *testing.T) {
	concurrent(t)
	l := setup(t)
	ctx := context.Background()
	id := fmt.Sprintf("%06x", rand.Uint32()>>8)
	victim, attacker := "e2e-agent-"+id, "attacker-"+id
	l.namespaces(t, victim, attacker)
	node, err := l.client.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	launcher := agent.Launcher{Client: l.client, Image: l.imagePrefix + "/kubectl-migrate-agent:lab", Namespace: agent.DefaultNamespace, AppNamespace: victim,
		Labels: map[string]string{"app.kubernetes.io/name": "kubectl-migrate-agent", "e2e": id}, Serving: &agent.Serving{}}
	t.Cleanup(func() { _ = launcher.Release(context.Background()) })
	if err := launcher.Warm(ctx, "agent-"+id, "node-b", agent.WarmOptions{RuntimeSocket: agent.RuntimeSocket(node.Status.NodeInfo.ContainerRuntimeVersion)}); err != nil {
		t.Fatal(err)
	}
	pod, err := l.client.CoreV1().Pods(agent.DefaultNamespace).Get(ctx, "agent-"+id, metav1.GetOptions{})
	if err != nil || pod.Status.PodIP == "" {
		t.Fatalf("the agent pod has no IP: %v", err)
	}
	// The attacker: Python's standard library, in a pod of its own namespace.
	script := callerScript(fmt.Sprintf("http://%s:%d", pod.Status.PodIP, agent.ServePort), agent.ControlTokenHeader,
		[][3]string{{"POST", "/runtime", "{}"}, {"POST", "/stop-pod", `{"uid":"x"}`}, {"POST", "/remove", `{"archives":["*"]}`}, {"POST", "/pack", "{}"}, {"POST", "/pull", `{"images":["x"]}`}})
	logs := l.runPython(t, attacker, script)
	if got, want := logs, "codes"+strings.Repeat(" 401", 10); got != want {
		t.Fatalf("another namespace's calls to the agent answered %q, want %q", got, want)
	}
	// The migration itself, with its token, is served.
	if info, err := launcher.Runtime(ctx, "node-b"); err != nil || info.Name == "" {
		t.Fatalf("the migration's own call: %+v %v", info, err)
	}
}

// TestAnEditorOfTheNamespaceCannotReachTheAgents: an application in a
// namespace that enforces Pod Security baseline migrates (the agents run
// in their own namespace), pushing with a registry secret the agents get a
// copy of; while the agents run, a user bound to edit in the application's
// namespace can neither list, read (the token in their environment), call
// through the API server, change nor delete an agent, nor read the copy of
// the secret, nor start a pod with host paths in the application's
// namespace. Every message is conserved and nothing is left behind.
func TestAnEditorOfTheNamespaceCannotReachTheAgents(t *testing.T) {
	concurrent(t)
	l := setup(t)
	ctx := context.Background()
	w := l.deployWith(t, workload.Options{Rate: "10", PodSecurity: "baseline"})
	l.registrySecret(t, w.Namespace, "regcred", l.registry)
	editor := l.editorOf(t, w.Namespace)
	waitApplied(t, w, "consumer", 20)

	// The editor tries while the migration's agents run (RBAC refuses
	// before it looks for the object, so a refusal after they ended would
	// prove the same; the test sees them running to read their token).
	type result struct {
		rec    report.Record
		stderr string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--registry-secret", "regcred")
		done <- result{rec, stderr, err}
	}()
	var agents []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case r := <-done:
			done <- r
			return false, fmt.Errorf("the migration ended before its agents were seen: %v\n%s", r.err, r.stderr)
		default:
		}
		records, err := report.Store{Client: l.client}.List(ctx, w.Namespace)
		if err != nil || len(records) == 0 {
			return false, nil
		}
		pods, err := l.client.CoreV1().Pods(agent.DefaultNamespace).List(ctx, metav1.ListOptions{LabelSelector: migrate.MigrationLabel + "=" + records[0].ID})
		if err != nil {
			return false, nil
		}
		agents = slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.Status.Phase != corev1.PodRunning })
		return len(agents) > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	agentPod := agents[0]
	// The agent's token is in its request, mounted as a file.
	if !slices.ContainsFunc(agentPod.Spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == agentPod.Name }) {
		t.Fatalf("agent %s carries no token from its request: the test would prove nothing", agentPod.Name)
	}
	if agentPod.Namespace == w.Namespace {
		t.Fatalf("agent %s runs in the application's namespace", agentPod.Name)
	}
	attempts := map[string]error{}
	_, attempts["list the agents"] = editor.CoreV1().Pods(agent.DefaultNamespace).List(ctx, metav1.ListOptions{})
	_, attempts["read an agent (and its token)"] = editor.CoreV1().Pods(agent.DefaultNamespace).Get(ctx, agentPod.Name, metav1.GetOptions{})
	_, attempts["read an agent's request (its token)"] = editor.CoreV1().Secrets(agent.DefaultNamespace).Get(ctx, agentPod.Name, metav1.GetOptions{})
	_, attempts["call an agent through the API server"] = editor.CoreV1().RESTClient().Post().Namespace(agent.DefaultNamespace).Resource("pods").
		Name(fmt.Sprintf("%s:%d", agentPod.Name, agent.ServePort)).SubResource("proxy").Suffix("runtime").
		SetHeader(agent.ControlTokenHeader, "guess").Body([]byte("{}")).DoRaw(ctx)
	_, attempts["swap an agent's image"] = editor.CoreV1().Pods(agent.DefaultNamespace).Patch(ctx, agentPod.Name, types.StrategicMergePatchType,
		[]byte(`{"spec":{"containers":[{"name":"agent","image":"`+l.imagePrefix+`/ms2m-consumer:lab"}]}}`), metav1.PatchOptions{})
	attempts["delete an agent"] = editor.CoreV1().Pods(agent.DefaultNamespace).Delete(ctx, agentPod.Name, metav1.DeleteOptions{})
	_, attempts["read the agents' registry secret"] = editor.CoreV1().Secrets(agent.DefaultNamespace).List(ctx, metav1.ListOptions{})
	for what, err := range attempts {
		if !apierrors.IsForbidden(err) {
			t.Errorf("the editor could %s: %v", what, err)
		}
	}
	// Its own namespace enforces baseline: no pod of the editor's reaches
	// the node's checkpoints.
	hostPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "reach-checkpoints", Namespace: w.Namespace},
		Spec: corev1.PodSpec{NodeName: "node-b", Containers: []corev1.Container{{Name: "c", Image: l.imagePrefix + "/ms2m-consumer:lab",
			VolumeMounts: []corev1.VolumeMount{{Name: "cp", MountPath: "/cp"}}}},
			Volumes: []corev1.Volume{{Name: "cp", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: agent.CheckpointDir}}}}},
	}
	if _, err := editor.CoreV1().Pods(w.Namespace).Create(ctx, hostPod, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Errorf("the editor's pod with the checkpoint directory: %v", err)
	}

	r := <-done
	if r.err != nil {
		t.Fatalf("migration failed: %v\n%s", r.err, r.stderr)
	}
	checkConservation(t, w, r.rec.TargetPod)
	l.noAgentsLeft(t, w.Namespace)
}

// editorOf returns a client acting as a service account bound to the
// cluster's edit role in namespace: what a member of the application's team
// may do.
func (l *lab) editorOf(t *testing.T, namespace string) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "editor", Namespace: namespace}}
	if _, err := l.client.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "editor", Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "editor", Namespace: namespace}},
	}
	if _, err := l.client.RbacV1().RoleBindings(namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(l.config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":editor"}
	editor, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The binding holds once the authorizer's cache has it.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := editor.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the editor cannot list its own namespace's pods: %v", err)
	}
	return editor
}

// TestTenantCannotClaimAStagedCheckpoint: a checkpoint staged on the target
// node for a migration's target (namespace, pod, container) is claimed by a
// container's create under the kubectl-migrate runtime. A pod of another
// namespace, on that node, under that RuntimeClass, that carries
// containerd's sandbox-namespace/sandbox-name/container-name annotations
// naming the target (CRI-O copies pod annotations into the container's
// spec) starts afresh as itself: the staged checkpoint is neither restored
// into it nor removed. Nor is it by a pod of the target's own name and
// namespace that is not the pod it is bound to (another UID). Before that, node-setup's admission policy refuses
// such a pod from an editor of the namespace (who may not migrate there);
// the pod that reaches the node is an allowed migrator's. While it runs,
// node-setup --uninstall refuses. Runs on both runtime lanes (CRI-O,
// containerd 2.4).
func TestTenantCannotClaimAStagedCheckpoint(t *testing.T) {
	l := setupUnderRuntime(t)
	ctx := context.Background()
	// The victim's target pod, by its UID: the migration binds what it
	// stages to the pod it created.
	victim := ociruntime.Identity{Namespace: fmt.Sprintf("victim-%06x", rand.Uint32()>>8), Pod: "consumer-restored", UID: fmt.Sprintf("%08x-0000-4000-8000-000000000000", rand.Uint32()), Container: "consumer"}
	// What a target agent stages: CRIU's images and the file changes. A
	// restore of these fails, so a claim would show as a failed create too.
	staged := filepath.Join(env(t, "LAB_RUN"), "node-b", "upper", ociruntime.StagePath(ociruntime.StageDir, victim))
	memory := filepath.Join(staged, "checkpoint", "pages-1.img")
	if err := os.MkdirAll(filepath.Dir(memory), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(memory, []byte("the victim's memory"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.RemoveAll(filepath.Join(env(t, "LAB_RUN"), "node-b", "upper", ociruntime.StageDir, victim.Namespace))
	})

	attacker := fmt.Sprintf("attacker-%06x", rand.Uint32()>>8)
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: attacker}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.client.CoreV1().Namespaces().Delete(context.Background(), attacker, metav1.DeleteOptions{})
	})
	l.waitDefaultServiceAccount(t, attacker)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "thief", Namespace: attacker, Annotations: map[string]string{
			// containerd's keys, which CRI-O copies from the pod as they are
			"io.kubernetes.cri.container-type":    "container",
			"io.kubernetes.cri.sandbox-namespace": victim.Namespace,
			"io.kubernetes.cri.sandbox-name":      victim.Pod,
			"io.kubernetes.cri.sandbox-uid":       victim.UID,
			"io.kubernetes.cri.container-name":    victim.Container,
			// CRI-O's own keys, which containerd copies and CRI-O writes over
			"io.kubernetes.pod.namespace":       victim.Namespace,
			"io.kubernetes.pod.name":            victim.Pod,
			"io.kubernetes.pod.uid":             victim.UID,
			"io.kubernetes.container.name":      victim.Container,
			"io.kubernetes.cri-o.ContainerType": "container",
		}},
		Spec: corev1.PodSpec{
			NodeName:         "node-b",
			RuntimeClassName: ptr.To(ociruntime.HandlerName),
			Containers:       []corev1.Container{{Name: victim.Container, Image: l.imagePrefix + "/pause:lab"}},
		},
	}
	// The policy holds once the API server has loaded it: a dry run (which
	// admission sees as a create) tells.
	editor := l.editorOf(t, attacker)
	var admitted error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, admitted = editor.CoreV1().Pods(attacker).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return admitted != nil, nil
	})
	if err != nil || !apierrors.IsForbidden(admitted) || !strings.Contains(admitted.Error(), "restores.kubectl-migrate.io") {
		t.Fatalf("an editor's pod under the RuntimeClass was not refused by the admission policy: %v", admitted)
	}
	if _, err := editor.CoreV1().Pods(attacker).Create(ctx, pod, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the editor created a pod under the RuntimeClass: %v", err)
	}
	t.Logf("the editor's pod: %v", admitted)

	// One allowed to migrate in the attacker's namespace (the lab's admin)
	// gets it to the node.
	if _, err := l.client.CoreV1().Pods(attacker).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last *corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := l.client.CoreV1().Pods(attacker).Get(ctx, "thief", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, nil
		}
		last = p
		cs := p.Status.ContainerStatuses[0]
		if w := cs.State.Waiting; w != nil && (w.Reason == "CreateContainerError" || w.Reason == "RunContainerError") {
			return false, fmt.Errorf("its create failed, as a restore of the staged checkpoint would: %s", w.Message)
		}
		return cs.State.Running != nil, nil
	})
	if err != nil {
		t.Fatalf("the attacker's pod did not start afresh: %v (%+v)", err, last)
	}
	if got, err := os.ReadFile(memory); err != nil || string(got) != "the victim's memory" {
		t.Fatalf("the victim's staged checkpoint was taken by the attacker's pod: %q, %v", got, err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(staged)); len(entries) != 1 {
		t.Fatalf("the stage beside the victim's checkpoint holds %v: a claim was made", entries)
	}

	// Uninstalling now would leave the pod without its runtime.
	out, err := l.kubectlCommand("migrate", "node-setup", "--all", "--uninstall", "--yes", "--agent-image", l.imagePrefix+"/kubectl-migrate-agent:lab").CombinedOutput()
	if err == nil || !strings.Contains(string(out), attacker+"/thief on node-b") {
		t.Fatalf("node-setup --uninstall with a pod under the RuntimeClass running: %v\n%s", err, out)
	}
	if n, err := l.client.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{}); err != nil || n.Labels[ociruntime.NodeLabel] != "installed" {
		t.Fatalf("the refused uninstall changed node-b: %v %v", n.Labels, err)
	}
	if err := l.client.CoreV1().Pods(attacker).Delete(ctx, "thief", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := l.client.CoreV1().Pods(attacker).Get(ctx, "thief", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("the attacker's pod did not go: %v", err)
	}

	// Within the victim's namespace, a pod that takes the target's name
	// (the target deleted, another created in its place) is another pod:
	// its UID is not the one the checkpoint is bound to.
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: victim.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.client.CoreV1().Namespaces().Delete(context.Background(), victim.Namespace, metav1.DeleteOptions{})
	})
	l.waitDefaultServiceAccount(t, victim.Namespace)
	namesake := pod.DeepCopy()
	namesake.Name, namesake.Namespace, namesake.Annotations = victim.Pod, victim.Namespace, nil
	created, err := l.client.CoreV1().Pods(victim.Namespace).Create(ctx, namesake, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := kube.WaitForPod(startCtx, l.client, victim.Namespace, victim.Pod, kube.ContainersRunning("", []string{victim.Container})); err != nil {
		t.Fatalf("the pod of the target's name (UID %s) did not start afresh: %v", created.UID, err)
	}
	if got, err := os.ReadFile(memory); err != nil || string(got) != "the victim's memory" {
		t.Fatalf("the checkpoint bound to %s was taken by the pod of its name with UID %s: %q, %v", victim.UID, created.UID, got, err)
	}
	if err := kube.DeleteAndWait(ctx, l.client, victim.Namespace, victim.Pod, ptr.To[int64](0)); err != nil {
		t.Fatal(err)
	}
}

// runPython runs script with the Python image's interpreter in a pod of
// namespace on node-b, as a tenant can, and returns what it printed.
func (l *lab) runPython(t *testing.T, namespace, script string) string {
	t.Helper()
	ctx := context.Background()
	l.waitDefaultServiceAccount(t, namespace)
	caller := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "caller", Namespace: namespace},
		Spec: corev1.PodSpec{NodeName: "node-b", RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
			Name: "caller", Image: l.imagePrefix + "/python-consumer:lab", Command: []string{"/usr/bin/python3", "-c", script},
		}}},
	}
	if _, err := l.client.CoreV1().Pods(namespace).Create(ctx, caller, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.WaitForPod(ctx, l.client, namespace, "caller", func(p *corev1.Pod) (bool, error) {
		return p != nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed), nil
	}); err != nil {
		t.Fatal(err)
	}
	logs, err := l.client.CoreV1().Pods(namespace).GetLogs("caller", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(logs))
}

// TestTenantCannotSteerAnotherNamespacesConsumer: a pod of another
// namespace calls a running consumer's endpoint over the pod network, as
// anyone in the cluster can reach it: STOP (to halt it for good), RESUME and
// PREPARE, and reads of its state, without a token and with a guess. Every
// call is refused, the consumer never stops, and it conserves every
// message. The migration, with the namespace's token, then moves it.
func TestTenantCannotSteerAnotherNamespacesConsumer(t *testing.T) {
	concurrent(t)
	l := setup(t)
	l.restoresSomeWay(t)
	ctx := context.Background()
	w := l.deploy(t, "10")
	waitApplied(t, w, "consumer", 20)
	pod, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, "consumer", metav1.GetOptions{})
	if err != nil || pod.Status.PodIP == "" {
		t.Fatalf("the consumer has no IP: %v", err)
	}
	attacker := fmt.Sprintf("attacker-%06x", rand.Uint32()>>8)
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: attacker}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.client.CoreV1().Namespaces().Delete(context.Background(), attacker, metav1.DeleteOptions{})
	})
	script := callerScript(fmt.Sprintf("http://%s:8080", pod.Status.PodIP), protocol.TokenHeader, [][3]string{
		{"POST", "/ms2m/control", `{"type":"STOP"}`}, {"POST", "/ms2m/control", `{"type":"RESUME"}`},
		{"POST", "/ms2m/control", fmt.Sprintf(`{"type":"PREPARE","payload":{"target":"%s/thief"}}`, attacker)}, {"GET", "/ms2m/state", ""},
	})
	if got, want := l.runPython(t, attacker, script), "codes"+strings.Repeat(" 401", 8); got != want {
		t.Fatalf("another namespace's calls to the consumer answered %q, want %q", got, want)
	}
	st := state(t, w, "consumer")
	if st.Mode != protocol.ModePrimary || st.PendingRestore || len(st.Homes) != 1 {
		t.Fatalf("the refused calls changed the consumer: %+v", st)
	}
	waitApplied(t, w, "consumer", st.LastSeq+10) // still consuming
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b")
	if err != nil || rec.Outcome != report.Succeeded {
		t.Fatalf("migration: %v\n%s", err, stderr)
	}
	checkConservation(t, w, rec.TargetPod)
}

// TestTenantForgingTheTargetsNameNeverConsumes: after a migration, a pod of
// another namespace on the target node runs the checkpoint image, taking
// the restored pod's name as its hostname, a namespace file naming the
// victim's namespace where the service account's would be, and a control
// token of its own where the victim's would be: everything a pod may choose.
// The restored copy finds that its new pod does not mount the token its
// memory holds, holds for good and consumes nothing, also once no
// migration runs; the victim conserves every message.
func TestTenantForgingTheTargetsNameNeverConsumes(t *testing.T) {
	concurrent(t)
	l, w, rec := migrateLivePod(t)
	ctx := context.Background()
	thief := startThief(t, l, w, rec, func(pod *corev1.Pod) {
		forged := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "forged", Namespace: pod.Namespace}, Data: map[string]string{"namespace": w.Namespace}}
		if _, err := l.client.CoreV1().ConfigMaps(pod.Namespace).Create(ctx, forged, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod.Spec.Hostname, pod.Spec.AutomountServiceAccountToken = rec.TargetPod, ptr.To(false)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "forged", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "forged"}}}})
		c := &pod.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "forged", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"})
	})
	st := thiefRunsTheVictim(t, w, thief, rec)
	if want := w.Namespace + "/" + rec.TargetPod; st.Foreign != want || st.Mode != protocol.ModeHold {
		t.Fatalf("the copy in a pod forging %s does not hold as foreign: %+v", want, st)
	}
	// A held copy with no migration running takes its queue back within a
	// second (a restart): watch it for several times that.
	var moved protocol.State
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		after, err := thief.State(ctx, "thief")
		if err != nil {
			t.Logf("the thief's copy did not answer: %v", err)
			return false, nil
		}
		moved = after
		return after.Position() != st.Position() || after.Mode != protocol.ModeHold || after.RestoredAgain != 0, nil
	}); err == nil {
		t.Fatalf("the forging copy moved from %s: %+v", st.Position(), moved)
	}
	checkConservation(t, w, rec.TargetPod)
}

// TestTenantAnonymousCheckpointsAreRefused: without --registry-secret (and
// with no pull secret on the pod), a checkpoint pushed to the lab's
// anonymous registry would be runnable by any pod on the target node and
// readable by anyone who reaches the registry. By default the migration is
// refused in preflight with one line naming the ways out, and nothing
// changes; the consumer conserves every message.
func TestTenantAnonymousCheckpointsAreRefused(t *testing.T) {
	concurrent(t)
	l := setup(t)
	w := l.deploy(t, "10")
	waitApplied(t, w, "consumer", 10)
	argv := []string{"migrate", "-n", w.Namespace, "pod", "consumer", "--to", "node-b", "--agent-image", l.imagePrefix + "/kubectl-migrate-agent:lab", "--insecure-registry"}
	out, err := l.kubectlCommand(argv...).CombinedOutput()
	if code := exitCode(err); code != 3 || strings.Count(string(out), "error:") != 1 ||
		!strings.Contains(string(out), "--registry-secret") || !strings.Contains(string(out), "--transfer direct") || !strings.Contains(string(out), "--allow-anonymous-checkpoints") {
		t.Fatalf("an anonymous checkpoint: exit %d, want 3 with one line naming the ways out:\n%s", code, out)
	}
	if records, err := (report.Store{Client: l.client}).List(context.Background(), w.Namespace); err != nil || len(records) != 0 {
		t.Fatalf("a refused migration left %d records (%v)", len(records), err)
	}
	l.nothingLeft(t, w)
	checkConservation(t, w, "consumer")
}

// TestTenantCannotSteerARecoveryByItsJournal: a migration dies before its
// commit point and leaves its journal in a ConfigMap of the application's
// namespace. A user bound to edit there flips the journal's committed flag
// (which would make the recovery complete a migration that had not
// committed). The operator's recover refuses it, its signature no longer
// holding, and changes nothing; with the journal as the migration wrote
// it, the recovery rolls back and the consumer conserves every message.
func TestTenantCannotSteerARecoveryByItsJournal(t *testing.T) {
	concurrent(t)
	l := setup(t)
	l.restoresSomeWay(t)
	ctx := context.Background()
	w := l.deploy(t, "10")
	waitApplied(t, w, "consumer", 20)
	editor := l.editorOf(t, w.Namespace)
	run, out := l.start(t, w, "pod", "consumer", "--to", "node-b", "--inject-crash", "restore")
	if err := run.Wait(); err == nil {
		t.Fatalf("the migration was not killed:\n%s", out)
	}
	rec := l.onlyRecord(t, w)
	name := "kubectl-migrate-" + rec.ID
	cm, err := editor.CoreV1().ConfigMaps(w.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the editor cannot read the journal: %v", err)
	}
	genuine := cm.Data["journal.json"]
	var j migrate.Journal
	if err := json.Unmarshal([]byte(genuine), &j); err != nil || j.State.Committed {
		t.Fatalf("journal: %v (committed %v)", err, j.State != nil && j.State.Committed)
	}
	j.State.Committed = true
	flipped, _ := json.Marshal(j)
	cm.Data["journal.json"] = string(flipped)
	if _, err := editor.CoreV1().ConfigMaps(w.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the editor cannot write the journal: %v", err)
	}
	pods := func() []string { return l.podPlaces(t, w.Namespace) }
	before := pods()
	argv := []string{"migrate", "recover", rec.ID, "-n", w.Namespace, "--agent-image", l.imagePrefix + "/kubectl-migrate-agent:lab"}
	refused, err := l.kubectlCommand(argv...).CombinedOutput()
	if err == nil || !strings.Contains(string(refused), "refusing its journal") {
		t.Fatalf("recover of a flipped journal: %v\n%s", err, refused)
	}
	if after := pods(); !slices.Equal(after, before) {
		t.Fatalf("the refused recovery changed the pods: %v, were %v", after, before)
	}
	cm, err = l.client.CoreV1().ConfigMaps(w.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["journal.json"] = genuine
	if _, err := l.client.CoreV1().ConfigMaps(w.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := l.recover(t, w, rec.ID); got.Outcome != report.RolledBack {
		t.Fatalf("recovered to %s", got.Outcome)
	}
	checkConservation(t, w, "consumer")
}

// callerScript is a Python script that makes each call (method, path,
// body) at base without a token and with a guessed one in header, and
// prints "codes" and the status of each.
func callerScript(base, header string, calls [][3]string) string {
	literal := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	var list []string
	for _, c := range calls {
		list = append(list, fmt.Sprintf("(%s, %s, %s)", literal(c[0]), literal(c[1]), literal(c[2])))
	}
	return fmt.Sprintf(`
import urllib.request, urllib.error
codes = []
for method, path, body in [%s]:
    for token in (None, "guess"):
        req = urllib.request.Request(%s + path, data=body.encode() if body else None, method=method)
        if token:
            req.add_header(%s, token)
        try:
            codes.append(urllib.request.urlopen(req, timeout=10).status)
        except urllib.error.HTTPError as e:
            codes.append(e.code)
print("codes", *codes)
`, strings.Join(list, ", "), literal(base), literal(header))
}

// TestTenantCannotOwnTheAgentsNamespace: a tenant who made the agents'
// namespace before kubectl migrate did (labelled as its own, with
// themselves bound admin there) would own every agent later started in it,
// root on its node, and the secrets it holds. A migration, check and
// node-setup pointed at it refuse before creating anything there, naming
// the binding; the consumer keeps serving and conserves every message.
func TestTenantCannotOwnTheAgentsNamespace(t *testing.T) {
	l := setup(t)
	ctx := context.Background()
	squatted := fmt.Sprintf("agents-%06x", rand.Uint32()>>8)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: squatted, Labels: map[string]string{
		kube.ManagedByLabel: kube.ManagedBy, "pod-security.kubernetes.io/enforce": "privileged",
	}}}
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.client.CoreV1().Namespaces().Delete(context.Background(), squatted, metav1.DeleteOptions{})
	})
	owner := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: squatted},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "tenant"}},
	}
	if _, err := l.client.RbacV1().RoleBindings(squatted).Create(ctx, owner, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const named = "RoleBinding owner (ClusterRole admin to User tenant)"

	w := l.deploy(t, "10")
	before := waitApplied(t, w, "consumer", 10)
	_, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--agent-namespace", squatted)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if last := lines[len(lines)-1]; exitCode(err) != 3 || !strings.Contains(last, named) {
		t.Fatalf("want a refusal (exit 3) naming %q, got %v:\n%s", named, err, stderr)
	}
	if res, _, err := l.runCheck(t, "node-a", "node-b", "--agent-namespace", squatted); err == nil || !strings.Contains(link(res, check.LinkPermissions).Detail, named) {
		t.Fatalf("check with the squatted agents' namespace: %v %+v", err, res.Links)
	}
	out, err := l.kubectlCommand("migrate", "node-setup", "--all", "--yes", "--agent-namespace", squatted, "--agent-image", l.imagePrefix+"/kubectl-migrate-agent:lab").CombinedOutput()
	if err == nil || !strings.Contains(string(out), named) {
		t.Fatalf("node-setup with the squatted agents' namespace: %v\n%s", err, out)
	}
	if pods, err := l.client.CoreV1().Pods(squatted).List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) != 0 {
		t.Fatalf("pods in the squatted namespace: %v %v", pods, err)
	}
	if secrets, err := l.client.CoreV1().Secrets(squatted).List(ctx, metav1.ListOptions{}); err != nil || len(secrets.Items) != 0 {
		t.Fatalf("secrets in the squatted namespace: %v %v", secrets, err)
	}
	if st := state(t, w, "consumer"); st.Mode != protocol.ModePrimary || st.Process != before.Process {
		t.Fatalf("the source was disturbed: %+v", st)
	}
	checkConservation(t, w, "consumer")
}

// TestTenantAgentsActOnlyWhereTheirRequesterMigrates: a migrator bound to
// docs/rbac.yaml in a namespace of their own, next to a victim's consumer.
// They cannot create a pod where the agents run; a request for an agent
// acting on the victim's namespace is refused at admission; a request for
// more than an agent may be (another command, another image) is refused
// by the controller, no pod built; their own agent, with their own token,
// refuses to checkpoint or stop the victim's pod; and they cannot end an
// agent the victim's migration asked for. The victim conserves every
// message.
func TestTenantAgentsActOnlyWhereTheirRequesterMigrates(t *testing.T) {
	l := setup(t)
	victim := l.deploy(t, "10")
	ctx := context.Background()
	l.applyDocumentedRoles(t)
	attacker := "attacker-" + fmt.Sprintf("%06x", rand.Uint32()>>8)
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: attacker}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.client.CoreV1().Namespaces().Delete(context.Background(), attacker, metav1.DeleteOptions{})
	})
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "migrator", Namespace: attacker}}
	bindings := []*rbacv1.RoleBinding{
		{ObjectMeta: metav1.ObjectMeta{Name: "kubectl-migrate", Namespace: attacker}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubectl-migrate"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "kubectl-migrate-agents-" + attacker, Namespace: agent.DefaultNamespace}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "kubectl-migrate-agents"}},
	}
	for _, b := range bindings {
		if _, err := l.client.RbacV1().RoleBindings(b.Namespace).Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = l.client.RbacV1().RoleBindings(b.Namespace).Delete(context.Background(), b.Name, metav1.DeleteOptions{})
		})
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", l.serviceAccountKubeconfig(t, attacker, "migrator"))
	if err != nil {
		t.Fatal(err)
	}
	migrator := kubernetes.NewForConfigOrDie(cfg)
	before := waitApplied(t, victim, "consumer", 20)
	source, err := l.client.CoreV1().Pods(victim.Namespace).Get(ctx, "consumer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	image := l.imagePrefix + "/kubectl-migrate-agent:lab"

	// A pod of one's own where the agents run: RBAC says no.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "root-" + attacker, Namespace: agent.DefaultNamespace},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "x", Image: image}}}}
	if _, err := migrator.CoreV1().Pods(agent.DefaultNamespace).Create(ctx, pod, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the migrator created a pod in the agents' namespace: %v", err)
	}
	// A request acting on the victim's namespace: admission says no.
	req := agent.AgentRequest{Node: "node-a", Image: image, Command: "serve"}
	forged, _ := agent.RequestSecret("forged-"+attacker, agent.DefaultNamespace, victim.Namespace, nil, req, "mine", "", nil)
	if _, err := migrator.CoreV1().Secrets(agent.DefaultNamespace).Create(ctx, forged, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may not create restores") {
		t.Fatalf("a request for the victim's namespace: %v", err)
	}
	// A request for their own namespace asking for more than an agent: the
	// controller builds nothing.
	greedy := agent.AgentRequest{Node: "node-a", Image: image, Command: "node-setup"}
	greedySecret, _ := agent.RequestSecret("greedy-"+attacker, agent.DefaultNamespace, attacker, nil, greedy, "mine", "", nil)
	if _, err := migrator.CoreV1().Secrets(agent.DefaultNamespace).Create(ctx, greedySecret, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a request for one's own namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = l.client.CoreV1().Secrets(agent.DefaultNamespace).Delete(context.Background(), greedySecret.Name, metav1.DeleteOptions{})
	})
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		events, err := l.client.CoreV1().Events(agent.DefaultNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + greedySecret.Name})
		return err == nil && len(events.Items) > 0 && events.Items[0].Reason == "Refused", nil
	})
	if err != nil {
		t.Fatalf("the controller did not refuse a request for node-setup: %v", err)
	}
	if _, err := l.client.CoreV1().Pods(agent.DefaultNamespace).Get(ctx, greedySecret.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the controller built a pod for node-setup: %v", err)
	}

	// Their own agent, on the victim's node, with their own token.
	node, err := l.client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	own := agent.Launcher{Client: migrator, Image: image, Namespace: agent.DefaultNamespace, AppNamespace: attacker,
		Labels: map[string]string{"e2e": attacker}, Serving: &agent.Serving{}}
	t.Cleanup(func() { _ = own.Release(context.Background()) })
	if err := own.Warm(ctx, "agent-"+attacker, "node-a", agent.WarmOptions{RuntimeSocket: agent.RuntimeSocket(node.Status.NodeInfo.ContainerRuntimeVersion)}); err != nil {
		t.Fatal(err)
	}
	if _, err := own.Checkpoint(ctx, "node-a", agent.CheckpointRequest{Namespace: victim.Namespace, Pod: "consumer", UID: string(source.UID), Container: "consumer"}); err == nil || !strings.Contains(err.Error(), "acts for namespace "+attacker+" only") {
		t.Fatalf("the migrator's agent checkpointed the victim: %v", err)
	}
	if _, err := own.StopPod(ctx, "node-a", string(source.UID)); err == nil || !strings.Contains(err.Error(), "acts for namespace "+attacker+" only") {
		t.Fatalf("the migrator's agent stopped the victim: %v", err)
	}
	if _, err := own.Runtime(ctx, "node-a"); err != nil {
		t.Fatalf("the migrator's agent does not serve its own migration: %v", err)
	}

	// An agent the victim's migration asked for cannot be ended by them.
	theirs := agent.Launcher{Client: l.client, Image: image, Namespace: agent.DefaultNamespace, AppNamespace: victim.Namespace,
		Labels: map[string]string{"e2e": victim.Namespace}, Serving: &agent.Serving{}}
	t.Cleanup(func() { _ = theirs.Release(context.Background()) })
	if err := theirs.Warm(ctx, "agent-"+victim.Namespace, "node-b", agent.WarmOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := migrator.CoreV1().Secrets(agent.DefaultNamespace).Delete(ctx, "agent-"+victim.Namespace, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the migrator ended the victim's agent: %v", err)
	}

	if st := waitApplied(t, victim, "consumer", before.LastSeq+20); st.Mode != protocol.ModePrimary {
		t.Fatalf("the victim's consumer: %+v", st)
	}
	checkConservation(t, victim, "consumer")
}

// TestAMigrationTheControllerRefusesChangesNothing: a migration asking for
// agents the agents' controller will not start (an image other than the
// one the administrator installed) is refused in setup, before any change,
// with the controller's reason and the remedy on one line; it leaves no
// agent request behind, and the consumer conserves every message.
func TestAMigrationTheControllerRefusesChangesNothing(t *testing.T) {
	concurrent(t)
	l := setup(t)
	installed := l.imagePrefix + "/kubectl-migrate-agent:lab"
	w, before := l.refusedBeforeAnyChange(t, "pass --agent-image "+installed+" or leave it out",
		"--agent-image", l.imagePrefix+"/kubectl-migrate-agent:not-installed")
	if st := waitApplied(t, w, "consumer", before.LastSeq+10); st.Mode != protocol.ModePrimary || st.Process != before.Process {
		t.Fatalf("the consumer after the refusal: %+v", st)
	}
	checkConservation(t, w, "consumer")
}
