package ms2m

import (
	"bytes"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// The control token (contract 4). The endpoints of an application steer
// its consumption, and the pod network reaches them from every namespace:
// each call must carry the token of the namespace's ControlSecret, which
// the application's pod mounts and the migration manager reads through the
// API server. Only who may read that Secret (the namespace's own editors
// and the migration role) can steer the consumer.
//
// The token also proves where a restored copy runs. The copy keeps, in its
// memory, the token it read at start; after a restore it reads the file of
// the pod it now runs in. A pod of another namespace cannot mount the
// Secret, so whatever it mounts there (or its hostname and namespace file,
// which it controls) cannot pass for the copy's home.
const (
	// ControlSecret is the Secret, in the application's namespace, whose
	// TokenKey holds the token.
	ControlSecret = "ms2m-control"
	// TokenKey is the key of the token in ControlSecret.
	TokenKey = "token"
	// DefaultTokenFile is where the pod mounts the token: ControlSecret as
	// a volume at /var/run/secrets/ms2m ($MS2M_TOKEN_FILE overrides it).
	DefaultTokenFile = "/var/run/secrets/ms2m/" + TokenKey
	// TokenHeader carries the token on every request to an /ms2m/ path
	// (the API server's proxy keeps its callers' Authorization to itself).
	TokenHeader = "Ms2m-Token"
)

// TokenFile is $MS2M_TOKEN_FILE, or DefaultTokenFile.
func TokenFile() string { return EnvOr("MS2M_TOKEN_FILE", DefaultTokenFile) }

// ReadToken reads the control token in file.
func ReadToken(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err == nil && len(bytes.TrimSpace(b)) == 0 {
		err = fmt.Errorf("%s is empty", file)
	}
	if err != nil {
		return nil, fmt.Errorf("no MS2M control token: %w; mount the Secret %s (key %s) of the pod's namespace at %s (docs/contract.md, \"Control token\")", err, ControlSecret, TokenKey, file)
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
		if !tokenMatches(token, r.Header.Get(TokenHeader)) {
			http.Error(w, "missing or wrong "+TokenHeader+" header: send the token of the namespace's Secret "+ControlSecret, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
