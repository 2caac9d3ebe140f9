package ms2m

import (
	"bytes"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// TokenFile is $MS2M_TOKEN_FILE, or DefaultTokenFile.
func TokenFile() string { return EnvOr("MS2M_TOKEN_FILE", protocol.DefaultTokenFile) }

// ReadToken reads the control token in file.
func ReadToken(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err == nil && len(bytes.TrimSpace(b)) == 0 {
		err = fmt.Errorf("%s is empty", file)
	}
	if err != nil {
		return nil, fmt.Errorf("no MS2M control token: %w; mount the Secret %s (key %s) of the pod's namespace at %s (docs/contract.md, \"Control token\")", err, protocol.ControlSecret, protocol.TokenKey, file)
	}
	return bytes.TrimSpace(b), nil
}

// tokenMatches reports whether got is token, in constant time.
func tokenMatches(token []byte, got string) bool {
	return len(token) > 0 && subtle.ConstantTimeCompare(token, []byte(strings.TrimSpace(got))) == 1
}

// requireToken serves h's /ms2m/ paths only to requests that carry token
// (none at all while the application has none: tokenErr says why); the
// health endpoints stay open, for probes.
func requireToken(token []byte, tokenErr error, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/ms2m/") {
			h.ServeHTTP(w, r)
			return
		}
		if tokenErr != nil {
			http.Error(w, tokenErr.Error(), http.StatusServiceUnavailable)
			return
		}
		if !tokenMatches(token, r.Header.Get(protocol.TokenHeader)) {
			http.Error(w, "missing or wrong "+protocol.TokenHeader+" header: send the token of the namespace's Secret "+protocol.ControlSecret, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
