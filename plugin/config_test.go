package plugin

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
)

// TestToConfig: flags and, where a flag is not set, the pod's annotations
// make the engine's config, the same way for pod and sts, in one place.
func TestToConfig(t *testing.T) {
	annotated := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Annotations: map[string]string{
			migrate.BrokerURLAnnotation: "amqp://b", migrate.ExchangeAnnotation: "ex", migrate.QueueAnnotation: "q",
			migrate.ControlPortAnnotation: "9000", migrate.RegistryAnnotation: "reg:5000/ckpt/",
		}},
		Spec: corev1.PodSpec{ImagePullSecrets: []corev1.LocalObjectReference{{Name: "pull"}}},
	}
	templated := annotated.DeepCopy()
	templated.Name, templated.Annotations[migrate.QueueAnnotation] = "consumer-1", "work-$(POD_NAME)"
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "redis"}}
	badPort := annotated.DeepCopy()
	badPort.Annotations[migrate.ControlPortAnnotation] = "http"
	// Anyone who may edit the pod can point the operator's client at its
	// own TLS files for a broker of their choosing.
	fileURL := annotated.DeepCopy()
	fileURL.Annotations[migrate.BrokerURLAnnotation] = "amqps://b/?certfile=/home/op/.ssh/client.pem&keyfile=/home/op/.ssh/client.key"
	shared := func(mod func(*migrationFlags)) migrationFlags {
		f := migrationFlags{To: "node-b", Strategy: "ms2m", ReplayTimeout: time.Minute, PhaseTimeout: time.Minute, Timeout: time.Hour, namespace: "ns", pod: "consumer"}
		if mod != nil {
			mod(&f)
		}
		return f
	}
	for _, tc := range []struct {
		name    string
		cmd     migrationCommand
		pod     *corev1.Pod
		check   func(migrate.Config) bool
		wantErr string
	}{
		{"annotations fill what flags leave", &PodOptions{migrationFlags: shared(nil), Transfer: "registry"}, annotated, func(c migrate.Config) bool {
			return c.Broker == migrate.BrokerConfig{URL: "amqp://b", Exchange: "ex", Queue: "q"} && c.ControlPort == 9000 &&
				c.ImageRepository == "reg:5000/ckpt" && c.RegistrySecret == "pull" && c.TargetName == "consumer-x1y2z" && c.ID == "x1y2z"
		}, ""},
		{"flags win", &PodOptions{migrationFlags: shared(func(f *migrationFlags) {
			f.BrokerURL, f.Queue, f.ControlPort, f.Registry, f.RegistrySecret = "amqp://flag", "fq", 8081, "other:5000/c", "mine"
		}), TargetName: "moved", ReplayMax: 4 * time.Second}, annotated, func(c migrate.Config) bool {
			return c.Broker.URL == "amqp://flag" && c.Broker.Queue == "fq" && c.Broker.Exchange == "ex" && c.ControlPort == 8081 &&
				c.ImageRepository == "other:5000/c" && c.RegistrySecret == "mine" && c.TargetName == "moved" && c.ReplayMax == 4*time.Second
		}, ""},
		{"direct needs no registry", &PodOptions{migrationFlags: shared(nil), Transfer: "direct"}, annotated, func(c migrate.Config) bool {
			return c.Transfer == migrate.Direct && c.ImageRepository == ""
		}, ""},
		{"a StatefulSet pod keeps its name", &StsOptions{migrationFlags: shared(func(f *migrationFlags) { f.pod = "consumer-0" }), Mode: "shadow", statefulSet: "consumer"}, annotated, func(c migrate.Config) bool {
			return c.StatefulSet == "consumer" && c.Mode == migrate.Shadow && c.Pod == "consumer-0" && c.TargetName == "consumer-0" && c.Transfer == migrate.ViaRegistry
		}, ""},
		{"an ordinal's own queue from its StatefulSet's template", &StsOptions{migrationFlags: shared(func(f *migrationFlags) { f.pod = "consumer-1" }), Mode: "sequential", statefulSet: "consumer"}, templated, func(c migrate.Config) bool {
			return c.Broker.Queue == "work-consumer-1"
		}, ""},
		{"flags alone", &PodOptions{migrationFlags: shared(nil)}, nil, func(c migrate.Config) bool {
			return c.ControlPort == 8080 && c.Broker == migrate.BrokerConfig{} && c.TargetName == ""
		}, ""},
		{"a pod with the contract moves with MS2M by default", &PodOptions{migrationFlags: shared(func(f *migrationFlags) { f.Strategy = "" })}, annotated, func(c migrate.Config) bool {
			return c.Strategy == migrate.MS2M
		}, ""},
		{"any other pod with checkpoint/restore, no broker asked", &PodOptions{migrationFlags: shared(func(f *migrationFlags) { f.Strategy = "" })}, plain, func(c migrate.Config) bool {
			return c.Strategy == migrate.CheckpointRestore && !strings.Contains(fmt.Sprint(c.Validate()), "broker")
		}, ""},
		{"a queue given makes it MS2M", &PodOptions{migrationFlags: shared(func(f *migrationFlags) { f.Strategy, f.Queue = "", "q" })}, plain, func(c migrate.Config) bool {
			return c.Strategy == migrate.MS2M
		}, ""},
		{"--strategy wins", &PodOptions{migrationFlags: shared(func(f *migrationFlags) { f.Strategy = "checkpoint-restore" })}, annotated, func(c migrate.Config) bool {
			return c.Strategy == migrate.CheckpointRestore
		}, ""},
		{"a port annotation that is no port", &PodOptions{migrationFlags: shared(nil)}, badPort, nil, "annotation ms2m.io/control-port=\"http\" is not a port"},
		{"an annotated broker URL naming local files", &PodOptions{migrationFlags: shared(nil)}, fileURL, nil, "names files on this machine (certfile, keyfile); pass --broker-url"},
		{"the operator's own URL may name them", &PodOptions{migrationFlags: shared(func(f *migrationFlags) { f.BrokerURL = "amqps://b/?cacertfile=/etc/ca.pem" })}, fileURL, func(c migrate.Config) bool {
			return c.Broker.URL == "amqps://b/?cacertfile=/etc/ca.pem"
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.cmd.toConfig(tc.pod, "x1y2z")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(c) {
				t.Fatalf("config %+v, %v", c, err)
			}
			if err := c.ValidateChoices(); err != nil {
				t.Fatalf("valid flags refused: %v", err)
			}
		})
	}
}
