package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// daemons are the processes a lab that is up runs.
func (d dirs) daemons() ([]string, error) {
	rt, err := d.runtime()
	if err != nil {
		return nil, err
	}
	names := []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "registry", "private-registry", "rabbitmq"}
	for _, n := range nodes {
		names = append(names, rt.daemon(n), n.Name+"-kubelet")
	}
	return names, nil
}

// healthy reports why the lab is not fully up, or nil.
func (d dirs) healthy() error {
	daemons, err := d.daemons()
	if err != nil {
		return err
	}
	for _, name := range daemons {
		if _, ok := d.running(name); !ok {
			return fmt.Errorf("%s is not running", name)
		}
	}
	return d.nodesReady(context.Background())
}

func (d dirs) nodesReady(ctx context.Context) error {
	client, err := d.adminClient()
	if err != nil {
		return err
	}
	for _, n := range nodes {
		node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := false
		for _, c := range node.Status.Conditions {
			ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
		}
		if !ready {
			return fmt.Errorf("node %s is not Ready", n.Name)
		}
	}
	return nil
}

func (d dirs) waitNodesReady(timeout time.Duration) error {
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		last = d.nodesReady(ctx)
		return last == nil, nil
	})
	if err != nil {
		return errors.Join(err, last)
	}
	return nil
}

func (d dirs) status() error {
	daemons, err := d.daemons()
	if err != nil {
		return err
	}
	for _, name := range daemons {
		if pid, ok := d.running(name); ok {
			fmt.Printf("%-24s running (PID %d)\n", name, pid)
		} else {
			fmt.Printf("%-24s stopped\n", name)
		}
	}
	if err := d.healthy(); err != nil {
		fmt.Printf("\nlab is not up: %v\n", err)
		return nil
	}
	fmt.Printf("\nlab is up. export KUBECONFIG=%s\n", d.kubeconfig())
	return nil
}

func (d dirs) printEnv() error {
	rt, err := d.runtime()
	if err != nil {
		return err
	}
	fmt.Printf("export KUBECONFIG=%s\n", d.kubeconfig())
	fmt.Printf("export LAB_RUNTIME=%s\n", rt.name)
	fmt.Printf("export LAB_REGISTRY=%s\n", registry)
	fmt.Printf("export LAB_PRIVATE_REGISTRY=%s\n", privateRegistry)
	fmt.Printf("export LAB_BROKER_URL=amqp://guest:guest@%s:%s/\n", labIP, amqpPort)
	fmt.Printf("export LAB_KUBECTL=%s\n", d.bin("kubectl"))
	fmt.Printf("export LAB_IMAGE_PREFIX=%s/kubectl-migrate\n", registry)
	// No kube-proxy: pods reach the API server at its own address, not at
	// the kubernetes Service's (node-setup's agents' controller).
	fmt.Printf("export KUBECTL_MIGRATE_API_SERVER=https://%s:%s\n", labIP, apiPort)
	// Each node's kubelet state is at $LAB_RUN/NODE/kubelet (checkpoint
	// archives in checkpoints/), for tests that check nothing is left.
	fmt.Printf("export LAB_RUN=%s\n", d.run)
	return nil
}
