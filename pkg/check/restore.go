package check

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/runtimesupport"
)

// The canary's way to the target: the transfer, the restored pod, and the
// proof that it goes on as the same process.

func (c *checker) push(ctx context.Context) (string, error) {
	if c.direct {
		req := c.receiver.Request(c.archive, "canary", c.cfg.Namespace, c.canary.Name, c.cfg.ID)
		if c.viaRuntime {
			req.StageAs = &ociruntime.Identity{Namespace: c.cfg.Namespace, Pod: c.restored, Container: "canary"}
		}
		res, err := c.deps.Packer.Pack(ctx, c.nextPod(), c.cfg.From, req)
		if err != nil {
			return "", fail(fmt.Sprintf("let the source node reach the target node's port %d (TLS)", agent.DirectReceivePort), "the agent on %s could not send the checkpoint to %s: %v", c.cfg.From, c.cfg.To, err)
		}
		c.archive = ""
		if c.viaRuntime {
			c.staged = res.Staged
			return fmt.Sprintf("staged on %s for the kubectl-migrate runtime (%d KiB, sent node to node over TLS; no image)", c.cfg.To, res.ArchiveBytes/1024), nil
		}
		c.image = res.Image // held by To's agent, which goes with cleanup's
		return fmt.Sprintf("%s (%d KiB, sent node to node over TLS; no registry)", res.Image, res.ArchiveBytes/1024), nil
	}
	ref := migrate.CheckpointImage(c.cfg.ImageRepository, c.canary.Namespace, c.canary.Name, "canary", c.cfg.ID)
	res, err := c.deps.Packer.Pack(ctx, c.nextPod(), c.cfg.From, agent.PackRequest{Archive: c.archive, Container: "canary", Image: ref, Insecure: c.cfg.InsecureRegistry})
	if err != nil {
		remedy := "pass --registry with a repository the agent can push to, --registry-secret with a dockerconfigjson secret it may use, or --insecure-registry for plain HTTP"
		return "", fail(remedy, "the agent on %s could not push %s: %v", c.cfg.From, ref, err)
	}
	c.archive, c.image = "", res.Image // the agent removed the archive once pushed
	c.result.Image = res.Image
	return fmt.Sprintf("%s (%d KiB) with the agent's credentials", res.Image, res.ArchiveBytes/1024), nil
}

type restoreOutcome struct {
	detail string
	err    error
}

// writePullSecret gives the restored canary the read credential of To's
// agent, which holds its image.
func (c *checker) writePullSecret(ctx context.Context) (string, error) {
	secret, err := migrate.PullSecret(c.cfg.Namespace, "kubectl-migrate-pull-"+MigrationID(c.cfg.ID), MigrationID(c.cfg.ID), c.receiver.Token)
	if err != nil {
		return "", err
	}
	if _, err := c.deps.Client.CoreV1().Secrets(c.cfg.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create the restored canary's pull secret: %w", err)
	}
	c.pullSecret = secret.Name
	return secret.Name, nil
}

// pull creates the restored canary on To and waits until its image is
// pulled (the node reached the registry) and then until it runs (the
// runtime restored it); the second verdict goes to the restore link.
func (c *checker) pull(ctx context.Context, restored chan<- restoreOutcome) (string, error) {
	source, err := c.deps.Client.CoreV1().Pods(c.cfg.Namespace).Get(ctx, c.canary.Name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	bases := migrate.BaseImages(source)
	if err := c.deps.Packer.Prepull(ctx, c.nextPod(), c.cfg.To, []string{bases["canary"]}); err != nil {
		return "", fail("pass --agent-image with an image the target node can pull", "node %s cannot pull the canary's base image %s: %v", c.cfg.To, bases["canary"], err)
	}
	via := migrate.RestoreCRI
	if c.viaRuntime {
		via = migrate.RestoreRuntime
	}
	pullSecret := c.cfg.RegistrySecret
	if c.direct && !c.viaRuntime {
		if pullSecret, err = c.writePullSecret(ctx); err != nil {
			return "", err
		}
	}
	pod := migrate.RestoredPod(source, c.restored, c.cfg.To, MigrationID(c.cfg.ID), map[string]string{"canary": cmp.Or(c.image, c.staged)}, pullSecret, via)
	c.restoring = true
	pod.Labels = c.labels()
	pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	created, err := c.deps.Client.CoreV1().Pods(c.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create the restored canary on %s: %w", c.cfg.To, err)
	}
	if c.viaRuntime {
		// The runtime restores only into the pod the checkpoint is bound
		// to, by UID, which exists only now.
		id := ociruntime.Identity{Namespace: c.cfg.Namespace, Pod: c.restored, UID: string(created.UID), Container: "canary"}
		if err := c.deps.Packer.Bind(ctx, c.cfg.To, []ociruntime.Identity{id}); err != nil {
			return "", fmt.Errorf("give the staged checkpoint to the restored canary on %s: %w", c.cfg.To, err)
		}
	}
	start := time.Now()
	_, err = kube.WaitForPod(ctx, c.deps.Client, c.cfg.Namespace, c.restored, func(p *corev1.Pod) (bool, error) {
		if p == nil {
			return false, errors.New("the restored canary was deleted")
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; kube.PullFailed(w) {
				return false, fail("let the node's runtime pull from the registry (CRI-O: registries.conf or insecure_registries; containerd: a hosts.toml under its config_path), or pass --registry-secret with a pull secret",
					"node %s cannot pull %s: %s: %s", c.cfg.To, c.image, w.Reason, w.Message)
			}
			if cs.ImageID != "" || cs.State.Running != nil || kube.StartFailed(cs.State.Waiting) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return "", err
	}
	go func() {
		_, err := kube.WaitForPod(ctx, c.deps.Client, c.cfg.Namespace, c.restored, kube.ContainersRunning("", []string{"canary"}))
		if err != nil {
			msg := err.Error()
			if why, ok := runtimesupport.ExplainRestoreFailure(c.target.Status.NodeInfo.ContainerRuntimeVersion, msg); ok {
				err = fail(why, "node %s: %s", c.cfg.To, msg)
			} else {
				err = fail("the runtime's log on "+c.cfg.To+" has CRIU's reason (restore.log); the target needs CRIU and the same CPU features as the source", "node %s: %s", c.cfg.To, msg)
			}
		}
		restored <- restoreOutcome{detail: fmt.Sprintf("%s running on %s after %s", c.restored, c.cfg.To, time.Since(start).Round(time.Millisecond)), err: err}
	}()
	if c.viaRuntime {
		return fmt.Sprintf("%s has the canary's own image", c.cfg.To), nil
	}
	return fmt.Sprintf("%s pulled the checkpoint image", c.cfg.To), nil
}

func (c *checker) sameProcess(ctx context.Context) (string, error) {
	var st protocol.State
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		if st, err = c.deps.App.State(ctx, c.canaryApp(c.restored)); err != nil {
			return false, nil
		}
		if st.Process != c.before.Process {
			return false, fail("the runtime created a new container instead of restoring the checkpoint: check its restore support and that the checkpoint image's annotations reach it",
				"the restored canary is process %s, not %s", st.Process, c.before.Process)
		}
		return st.LastSeq > c.before.LastSeq, nil
	})
	if err != nil {
		var r *migrate.Refusal
		if errors.As(err, &r) {
			return "", err
		}
		if st.Process == "" {
			return "", fmt.Errorf("the restored canary does not answer on port %d: %w", agent.CanaryPort, err)
		}
		return "", fail("CRIU's TCP handling: with tcp-close in /etc/criu/runc.conf the restored process reconnects",
			"the restored canary is the same process but its connection does not work again (%d pings, %d at the checkpoint)", st.LastSeq, c.before.LastSeq)
	}
	return fmt.Sprintf("process %s went on from %d to %d pings on %s (its connection reconnected %d time(s))", st.Process, c.before.LastSeq, st.LastSeq, c.cfg.To, st.Reconnects), nil
}
