// Package testenv gives tests the addresses of the real services they need:
// RabbitMQ and an OCI registry from test/services.sh, the lab from
// test/lab. Outside CI a test whose service is not configured is skipped; in
// CI it fails, so a missing service can never pass as green.
package testenv

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
)

// Require returns the environment variable key, which names a real service
// that setup (a command) provides.
func Require(t testing.TB, key, setup string) string {
	t.Helper()
	v := os.Getenv(key)
	if v == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set; CI must provide it: %s", key, setup)
		}
		t.Skipf("%s not set; run: %s", key, setup)
	}
	return v
}

const servicesSetup = `eval "$(test/services.sh up)"`

// AMQPURL is the URL of a real RabbitMQ on loopback.
func AMQPURL(t testing.TB) string { return Require(t, "MIGRATE_TEST_AMQP_URL", servicesSetup) }

// Registry is host:port of a real plain-HTTP OCI registry on loopback.
func Registry(t testing.TB) string { return Require(t, "MIGRATE_TEST_REGISTRY", servicesSetup) }

// Name returns a name unique to this test run, for queues and repositories.
func Name(prefix string) string { return fmt.Sprintf("%s-%08x", prefix, rand.Uint32()) }
