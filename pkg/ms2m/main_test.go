package ms2m

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// testToken is the control token of the tests' pod: every consumer and
// producer a test starts reads it from $MS2M_TOKEN_FILE, as one in a pod
// that mounts ControlSecret does.
const testToken = "test-token"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ms2m-token")
	if err != nil {
		panic(err)
	}
	file := filepath.Join(dir, protocol.TokenKey)
	if err := os.WriteFile(file, []byte(testToken+"\n"), 0o600); err != nil {
		panic(err)
	}
	os.Setenv("MS2M_TOKEN_FILE", file)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// tokenFileWith writes token where a test's other pod mounts it.
func tokenFileWith(t *testing.T, token string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), protocol.TokenKey)
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}
