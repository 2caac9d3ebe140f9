package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// demo brings the lab up, deploys the sample workload on node-a, migrates
// the consumer to node-b with kubectl migrate (through the real kubectl) and
// checks that no message was lost or applied twice.
func (d dirs) demo() error {
	if err := d.up(); err != nil {
		return err
	}
	ctx := context.Background()
	client, err := d.adminClient()
	if err != nil {
		return err
	}
	plugins := filepath.Join(d.cache, "plugins")
	if err := goBuild(".", nil, "-o", filepath.Join(plugins, "kubectl-migrate"), "./cmd/kubectl-migrate"); err != nil {
		return err
	}
	ns := fmt.Sprintf("demo-%d", time.Now().Unix())
	logf("deploying the sample workload in namespace %s: producer at 10 msg/s, consumer at 50 ms per message, on node-a", ns)
	w, err := workload.Deploy(ctx, client, workload.Options{
		Namespace: ns, Node: "node-a", ImagePrefix: registry + "/kubectl-migrate",
		BrokerURL: "amqp://guest:guest@" + labIP + ":" + amqpPort + "/", Registry: registry, Rate: "10", Work: "50ms",
	})
	if err != nil {
		return err
	}
	if _, err := w.WaitApplied(ctx, "consumer", 30, time.Minute); err != nil {
		return err
	}
	env := append(os.Environ(), "KUBECONFIG="+d.kubeconfig(), "PATH="+plugins+string(os.PathListSeparator)+os.Getenv("PATH"),
		fmt.Sprintf("KUBECTL_MIGRATE_API_SERVER=%s:%s", labIP, apiPort))
	// Once per cluster, an administrator's step: the agents' controller.
	logf("$ kubectl migrate node-setup --agents-only")
	setup := exec.Command(d.bin("kubectl"), "migrate", "node-setup", "--agents-only", "--agent-image", imageRef("kubectl-migrate-agent"))
	setup.Stdout, setup.Stderr, setup.Env = os.Stdout, os.Stderr, env
	if err := setup.Run(); err != nil {
		return fmt.Errorf("kubectl migrate node-setup --agents-only: %w", err)
	}
	// The lab's registry takes anonymous pulls.
	logf("$ kubectl migrate pod consumer --to node-b -n %s --allow-anonymous-checkpoints", ns)
	cmd := exec.Command(d.bin("kubectl"), "migrate", "pod", "consumer", "--to", "node-b", "-n", ns, "--allow-anonymous-checkpoints",
		"--agent-image", imageRef("kubectl-migrate-agent"), "--insecure-registry")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = env
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("migration: %w", err)
	}
	pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	target := ""
	for _, p := range pods.Items {
		if p.Name != "producer" {
			target = p.Name
		}
	}
	got, sent, err := w.CheckConservation(ctx, target)
	if err != nil {
		return err
	}
	logf("conservation: the producer sent %d messages; %s on node-b applied each exactly once (digest %s, application state %s)",
		sent.Totals.Count, target, got.Totals.Digest, got.App)
	logf("explore: export KUBECONFIG=%s PATH=%s:$PATH; kubectl get pods -n %s -o wide; kubectl migrate report -n %s", d.kubeconfig(), plugins, ns, ns)
	return nil
}
