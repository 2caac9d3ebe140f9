package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// inLab wraps argv to run in the lab's network namespace.
func inLab(argv ...string) []string {
	return append([]string{"ip", "netns", "exec", labNetns}, argv...)
}

// auditLog, in the lab's run directory, has every write to the API server
// but the nodes' and the control plane's own: the tests' proof of what a
// command changed (a read-only dry run, say).
const auditLog = "audit.log"

const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    verbs: [get, list, watch]
  - level: None
    userGroups: [system:nodes]
  - level: None
    users: [system:kube-controller-manager, system:kube-scheduler, system:apiserver]
  - level: None
    userGroups: ["system:serviceaccounts:kube-system"]
  - level: Metadata
`

func (d dirs) controlPlaneUp() error {
	if err := os.MkdirAll(d.state("etcd"), 0o700); err != nil {
		return err
	}
	if err := d.start("etcd", inLab(d.bin("etcd"), "--name=lab", "--data-dir="+d.state("etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=lab=http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level=warn"), nil); err != nil {
		return err
	}
	p := d.pki
	if err := os.WriteFile(d.state("audit-policy.yaml"), []byte(auditPolicy), 0o644); err != nil {
		return err
	}
	if err := d.start("kube-apiserver", inLab(d.bin("kube-apiserver"),
		"--audit-policy-file="+d.state("audit-policy.yaml"), "--audit-log-path="+d.state(auditLog),
		"--audit-log-format=json", "--audit-log-maxsize=200", "--audit-log-maxbackup=1",
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0", "--secure-port="+apiPort, "--advertise-address="+labIP,
		"--service-cluster-ip-range="+serviceCIDR,
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"), "--client-ca-file="+p("ca.crt"),
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC", "--allow-privileged=true",
		"--kubelet-client-certificate="+p("apiserver-kubelet-client.crt"), "--kubelet-client-key="+p("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP"), nil); err != nil {
		return err
	}
	client, err := d.adminClient()
	if err != nil {
		return err
	}
	if err := waitFor("kube-apiserver", 2*time.Minute, func() error {
		_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		return err
	}); err != nil {
		return err
	}
	if err := d.start("kube-controller-manager", inLab(d.bin("kube-controller-manager"),
		"--kubeconfig="+d.state("kcm.kubeconfig"), "--bind-address=127.0.0.1", "--leader-elect=false",
		"--service-account-private-key-file="+p("sa.key"), "--root-ca-file="+p("ca.crt"), "--use-service-account-credentials=true",
		"--cluster-signing-cert-file="+p("ca.crt"), "--cluster-signing-key-file="+p("ca.key"), "--controllers=*"), nil); err != nil {
		return err
	}
	return d.start("kube-scheduler", inLab(d.bin("kube-scheduler"),
		"--kubeconfig="+d.state("scheduler.kubeconfig"), "--bind-address=127.0.0.1", "--leader-elect=false"), nil)
}

func (d dirs) adminClient() (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", d.kubeconfig())
	if err != nil {
		return nil, fmt.Errorf("admin kubeconfig: %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}
