package migrate

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// Annotations the plugin reads from a workload's pod and writes on the
// restored one.
const (
	BrokerURLAnnotation = "ms2m.io/broker-url"
	// BrokerSecretAnnotation names a Secret of the pod's namespace with
	// the broker's username and password, which the URL then need not
	// carry.
	BrokerSecretAnnotation = "ms2m.io/broker-secret"
	ExchangeAnnotation     = "ms2m.io/exchange"
	QueueAnnotation        = "ms2m.io/queue"
	ControlPortAnnotation  = "ms2m.io/control-port"
	RegistryAnnotation     = "ms2m.io/registry"

	MigratedFromAnnotation = "migrate.ms2m.io/migrated-from"
	MigrationAnnotation    = "migrate.ms2m.io/migration"
	OriginalNameAnnotation = "migrate.ms2m.io/original-name"
	// BaseImagesAnnotation maps each restored container to the image it was
	// first created from (JSON): a restore needs that image on the node, and
	// a restored pod's own image is a checkpoint.
	BaseImagesAnnotation = "migrate.ms2m.io/base-images"
	MigrationLabel       = lease.MigrationLabel
)

// saTokenVolumePrefix names the volume admission adds for the service
// account token; it is regenerated with a new name for every pod, so it is
// never copied (copying it breaks the restore).
const saTokenVolumePrefix = "kube-api-access-"

// BaseImages returns each container's base image: the image it runs, by
// the digest the node resolved (a tag may have moved since, and the runtime
// restores on top of the very image, by ID), or for a restored container the
// one it was first created from.
func BaseImages(pod *corev1.Pod) map[string]string {
	bases := map[string]string{}
	_ = json.Unmarshal([]byte(pod.Annotations[BaseImagesAnnotation]), &bases) // absent: not restored
	running := map[string]string{}
	for _, cs := range pod.Status.ContainerStatuses {
		running[cs.Name] = cs.ImageID
	}
	for _, c := range pod.Spec.Containers {
		if bases[c.Name] == "" {
			bases[c.Name] = pinnedImage(c.Image, running[c.Name])
		}
	}
	return bases
}

// pinnedImage is image by the digest in imageID (a container status's
// "repo@sha256:…" or bare "sha256:…"), or image itself without one.
func pinnedImage(image, imageID string) string {
	_, digest, ok := strings.Cut(imageID, "sha256:")
	if !ok || len(digest) != 64 {
		return image
	}
	repo := image
	if i := strings.Index(repo, "@"); i >= 0 {
		repo = repo[:i]
	} else if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i] // drop the tag
	}
	return repo + "@sha256:" + digest
}

// CheckpointImage is where container of pod in namespace is pushed, in
// repository, for the migration (stage) tag: one repository per namespace
// and pod, so that a registry's per-path access rules can keep each
// namespace's checkpoints to its own.
func CheckpointImage(repository, namespace, pod, container, tag string) string {
	return repository + "/" + namespace + "/" + pod + ":" + container + "-" + tag
}

// CheckpointImageOf is where container of pod goes for the migration
// (stage) tag: the registry's repository, or with a direct transfer the
// target node's agent, as that node pulls it.
func (c Config) CheckpointImageOf(pod, container, tag string) string {
	return pathFor(c.Transfer, c.Restore).image(c, pod, container, tag)
}

// staged is the checkpoint of container staged for the kubectl-migrate
// runtime on the target node, restored as that container of the target pod:
// bound to its UID where the target exists before its checkpoint
// (createsTargetEarly); staged before it exists, the checkpoint is bound
// once it is created (createTarget).
func (m *Migration) staged(container string) ociruntime.Identity {
	id := ociruntime.Identity{Namespace: m.config.Namespace, Pod: m.config.TargetName, Container: container}
	if m.createsTargetEarly() && m.state.Target != nil {
		id.UID = string(m.state.Target.UID)
	}
	return id
}

// RestoredPod builds the pod a checkpoint of source is restored into, name
// on node, from images (by container), as via restores it: see targetPod
// and, through the kubectl-migrate runtime, forRuntimeRestore. The engine,
// check's canary and the dry-run plan all build it here.
func RestoredPod(source *corev1.Pod, name, node, migrationID string, images map[string]string, registrySecret string, via Restore) *corev1.Pod {
	pod := targetPod(source, name, node, migrationID, images, registrySecret)
	if via == RestoreRuntime {
		forRuntimeRestore(pod, source)
	}
	return pod
}

// targetPod builds the restored pod: the source's identity labels and
// annotations, pinned to node, each migrated container running its
// checkpoint image. A restored container gets only what restore needs (name,
// image, ports, resources, security context, mounts) and the kubelet's
// probes: command, environment and memory come from the checkpoint itself. Scheduling constraints are dropped
// because the pod is pinned, and the kubelet would refuse it if the source's
// node selector or affinity named the source node.
func targetPod(source *corev1.Pod, name, node, migrationID string, images map[string]string, registrySecret string) *corev1.Pod {
	annotations := maps.Clone(source.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	delete(annotations, corev1.LastAppliedConfigAnnotation)
	annotations[MigratedFromAnnotation] = source.Namespace + "/" + source.Name + "@" + source.Spec.NodeName
	annotations[MigrationAnnotation] = migrationID
	if _, ok := annotations[OriginalNameAnnotation]; !ok {
		annotations[OriginalNameAnnotation] = source.Name
	}
	bases := BaseImages(source)
	if encoded, err := json.Marshal(bases); err == nil {
		annotations[BaseImagesAnnotation] = string(encoded)
	}
	labels := maps.Clone(source.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[MigrationLabel] = migrationID

	spec := source.Spec
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: source.Namespace, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 spec.RestartPolicy,
			TerminationGracePeriodSeconds: spec.TerminationGracePeriodSeconds,
			ServiceAccountName:            spec.ServiceAccountName,
			AutomountServiceAccountToken:  spec.AutomountServiceAccountToken,
			SecurityContext:               spec.SecurityContext,
			ImagePullSecrets:              slices.Clone(spec.ImagePullSecrets),
			Tolerations:                   spec.Tolerations,
			Hostname:                      spec.Hostname,
			Subdomain:                     spec.Subdomain,
			DNSPolicy:                     spec.DNSPolicy,
			DNSConfig:                     spec.DNSConfig,
			PriorityClassName:             spec.PriorityClassName,
		},
	}
	if registrySecret != "" && !slices.ContainsFunc(pod.Spec.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == registrySecret }) {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: registrySecret})
	}
	usedVolumes := map[string]bool{}
	// The runtime restores a container only with every mount it was
	// checkpointed with, so mounts are kept, except the service account
	// token's, which admission adds again under a new name.
	keptMounts := func(mounts []corev1.VolumeMount) []corev1.VolumeMount {
		mounts = slices.DeleteFunc(slices.Clone(mounts), func(vm corev1.VolumeMount) bool {
			return strings.HasPrefix(vm.Name, saTokenVolumePrefix)
		})
		for _, vm := range mounts {
			usedVolumes[vm.Name] = true
		}
		return mounts
	}
	for _, c := range spec.Containers {
		if img, ok := images[c.Name]; ok {
			pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
				Name:            c.Name,
				Image:           img,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Ports:           c.Ports,
				Resources:       c.Resources,
				SecurityContext: c.SecurityContext,
				VolumeMounts:    keptMounts(c.VolumeMounts),
				// Probes are the kubelet's, not part of the checkpoint.
				LivenessProbe:  c.LivenessProbe,
				ReadinessProbe: c.ReadinessProbe,
				StartupProbe:   c.StartupProbe,
			})
			continue
		}
		// A container that is not migrated starts afresh from its spec.
		c = *c.DeepCopy()
		c.VolumeMounts = keptMounts(c.VolumeMounts)
		pod.Spec.Containers = append(pod.Spec.Containers, c)
	}
	if img := images[agent.VolumesKey]; img != "" {
		pod.Spec.InitContainers = []corev1.Container{volumeInit(source, img, slices.Collect(maps.Keys(images)))}
	}
	// The other init containers did their work on the source, and the
	// restored state has it; sidecars (init containers that keep running)
	// serve beside the application, so they go with it and, not
	// checkpointed, start afresh like a container that is not migrated,
	// after the emptyDir volumes are filled.
	for _, c := range spec.InitContainers {
		if isSidecar(c) {
			c = *c.DeepCopy()
			c.VolumeMounts = keptMounts(c.VolumeMounts)
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, c)
		}
	}
	for _, v := range spec.Volumes {
		if usedVolumes[v.Name] {
			pod.Spec.Volumes = append(pod.Spec.Volumes, v)
		}
	}
	return pod
}

// PlannedTarget is the pod the migration c creates from source's
// checkpoints (images, by container), as its dry run shows it.
func PlannedTarget(c Config, source *corev1.Pod, images map[string]string) *corev1.Pod {
	pod := RestoredPod(source, c.TargetName, c.TargetNode, c.ID, images, c.RegistrySecret, c.Restore)
	if pathFor(c.Transfer, c.Restore).createsEarly(c.StatefulSet, c.TargetName) {
		addressFirst(pod, c.AgentImage)
	}
	// The plan is printed: the broker's password stays out of it.
	if u, ok := pod.Annotations[BrokerURLAnnotation]; ok {
		pod.Annotations[BrokerURLAnnotation] = redactURL(u)
	}
	return pod
}

// AddressInitContainer is the no-op init container of a target created
// before its checkpoint exists (addressFirst).
const AddressInitContainer = "kubectl-migrate-address"

// addressFirst gives a target created before its checkpoint exists an init
// container that runs the agent binary's noop (its image is on the node,
// where the agent runs). The kubelet reports a pod's IP from a sync after
// the one that made its sandbox, and the runtime holds the sync that
// creates the restoring container until the checkpoint arrives. With an
// init container the sandbox's sync ends early and the next one reports
// the address before it creates that container. Without it the address
// (the engine reaches the restored copy through it) waits for the
// kubelet's relist after the restore: up to a second more on the critical
// path. It comes after the pod's sidecars, which the kubelet starts before
// it: once it has ended, creating the restoring containers is all that is
// left.
//
// It takes the first container's resources: a quota that wants every
// container to state them is met, and an init container no larger than
// the pod's containers adds nothing to what the pod asks of the node.
func addressFirst(pod *corev1.Pod, agentImage string) {
	init := corev1.Container{
		Name: AddressInitContainer, Image: agentImage, ImagePullPolicy: corev1.PullIfNotPresent,
		Args: []string{"noop"}, SecurityContext: agent.Restricted(),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	if len(pod.Spec.Containers) > 0 {
		init.Resources = *pod.Spec.Containers[0].Resources.DeepCopy()
	}
	pod.Spec.InitContainers = append(pod.Spec.InitContainers, init)
}

// forRuntimeRestore makes target (targetPod's) a pod the kubectl-migrate
// runtime restores: under its RuntimeClass, each container as the source
// ran it (the image it ran, by digest, with its command and environment),
// which the runtime's create turns into the restore of the checkpoint
// staged for it. A later restart of the container starts it from that spec,
// afresh, as any restart does.
func forRuntimeRestore(target, source *corev1.Pod) {
	target.Spec.RuntimeClassName = ptr.To(ociruntime.HandlerName)
	// The runtime fills the emptyDir volumes itself.
	target.Spec.InitContainers = slices.DeleteFunc(target.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == volumeInitContainer })
	bases := BaseImages(source)
	for i, c := range target.Spec.Containers {
		j := slices.IndexFunc(source.Spec.Containers, func(s corev1.Container) bool { return s.Name == c.Name })
		if j < 0 {
			continue
		}
		full := *source.Spec.Containers[j].DeepCopy()
		full.Image = bases[c.Name]
		full.VolumeMounts = c.VolumeMounts
		target.Spec.Containers[i] = full
	}
}

// isSidecar tells a native sidecar: an init container that keeps running
// beside the pod's containers.
func isSidecar(c corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}
