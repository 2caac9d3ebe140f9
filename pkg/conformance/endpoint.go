package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// Endpoint is an App reached over plain HTTP at URL (e.g.
// "http://127.0.0.1:8080").
type Endpoint struct {
	URL    string
	Token  string       // the control token every call carries
	Client *http.Client // default http.DefaultClient
}

// WithToken is e, calling with token.
func (e Endpoint) WithToken(token string) App { e.Token = token; return e }

// State reads the application's state.
func (e Endpoint) State(ctx context.Context) (protocol.State, error) {
	return e.do(ctx, http.MethodGet, protocol.StatePath, nil)
}

// Control sends a control message.
func (e Endpoint) Control(ctx context.Context, msg protocol.Control) (protocol.State, error) {
	body, _ := json.Marshal(msg)
	return e.do(ctx, http.MethodPost, protocol.ControlPath, body)
}

func (e Endpoint) do(ctx context.Context, method, path string, body []byte) (protocol.State, error) {
	var st protocol.State
	req, err := http.NewRequestWithContext(ctx, method, e.URL+path, bytes.NewReader(body))
	if err != nil {
		return st, err
	}
	req.Header.Set("Content-Type", "application/json")
	if e.Token != "" {
		req.Header.Set(protocol.TokenHeader, e.Token)
	}
	client := e.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return st, err
	}
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(raw))
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("%s %s: not a state: %w", method, path, err)
	}
	return st, nil
}
