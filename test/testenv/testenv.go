// Package testenv gives tests the addresses of the real services that
// test/services.sh starts (RabbitMQ, an OCI registry). Outside CI a test
// whose service is not configured is skipped; in CI it fails, so a missing
// service can never pass as green.
package testenv

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
)

func lookup(t testing.TB, key string) string {
	t.Helper()
	v := os.Getenv(key)
	if v == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set; CI must start the services with test/services.sh", key)
		}
		t.Skipf("%s not set; run eval $(test/services.sh up) to start the real services", key)
	}
	return v
}

// AMQPURL is the URL of a real RabbitMQ on loopback.
func AMQPURL(t testing.TB) string { return lookup(t, "MIGRATE_TEST_AMQP_URL") }

// Registry is host:port of a real plain-HTTP OCI registry on loopback.
func Registry(t testing.TB) string { return lookup(t, "MIGRATE_TEST_REGISTRY") }

// Name returns a name unique to this test run, for queues and repositories.
func Name(prefix string) string { return fmt.Sprintf("%s-%08x", prefix, rand.Uint32()) }
