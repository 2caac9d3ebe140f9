package conformance

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// testToken is the control token the tests' applications (Go in-process,
// Python as a child process) read from $MS2M_TOKEN_FILE.
const testToken = "conformance-token"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "conformance-token")
	if err != nil {
		panic(err)
	}
	file := filepath.Join(dir, protocol.TokenKey)
	if err := os.WriteFile(file, []byte(testToken), 0o600); err != nil {
		panic(err)
	}
	os.Setenv("MS2M_TOKEN_FILE", file)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
