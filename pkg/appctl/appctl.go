// Package appctl drives an MS2M application (see package ms2m) through the
// API server's pod proxy, so the plugin reaches each pod individually, by
// name, without a network path to the pod network.
package appctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// ErrNotApplied means the application has not applied any message after the
// asked sequence yet.
var ErrNotApplied = errors.New("nothing applied after that sequence yet")

// Client reaches applications through the pod proxy.
type Client struct {
	// REST is the core/v1 REST client.
	REST rest.Interface
}

// Target names one application instance.
type Target struct {
	Namespace string
	Pod       string
	Port      int
	// Token is the namespace's control token (protocol.ControlSecret), sent
	// with every call.
	Token string
}

func (t Target) String() string { return fmt.Sprintf("%s/%s:%d", t.Namespace, t.Pod, t.Port) }

func (c Client) request(verb string, t Target, path string) *rest.Request {
	req := c.REST.Verb(verb).Namespace(t.Namespace).Resource("pods").
		Name(t.Pod + ":" + strconv.Itoa(t.Port)).SubResource("proxy").Suffix(strings.TrimPrefix(path, "/"))
	if t.Token != "" {
		req = req.SetHeader(protocol.TokenHeader, t.Token)
	}
	return req
}

// State returns the instance's state.
func (c Client) State(ctx context.Context, t Target) (protocol.State, error) {
	var st protocol.State
	body, err := c.request(http.MethodGet, t, protocol.StatePath).DoRaw(ctx)
	if err != nil {
		return st, callError(t, "state", err, body)
	}
	return st, decode(t, body, &st)
}

// Control sends a control message and returns the state after it took effect.
func (c Client) Control(ctx context.Context, t Target, msg protocol.Control) (protocol.State, error) {
	var st protocol.State
	payload, _ := json.Marshal(msg)
	body, err := c.request(http.MethodPost, t, protocol.ControlPath).
		SetHeader("Content-Type", "application/json").Body(payload).DoRaw(ctx)
	if err != nil {
		return st, callError(t, string(msg.Type), err, body)
	}
	return st, decode(t, body, &st)
}

// AppliedAfter returns when the instance applied its first message after
// the one at p.
func (c Client) AppliedAfter(ctx context.Context, t Target, p protocol.Position) (protocol.Applied, error) {
	var a protocol.Applied
	req := c.request(http.MethodGet, t, protocol.AppliedPath).Param("after", strconv.FormatUint(p.Seq, 10))
	if p.Producer != "" {
		req = req.Param("producer", p.Producer)
	}
	body, err := req.DoRaw(ctx)
	if apierrors.IsNotFound(err) && strings.Contains(string(body), "nothing applied") {
		return a, ErrNotApplied
	}
	if err != nil {
		return a, callError(t, "applied", err, body)
	}
	return a, decode(t, body, &a)
}

func decode(t Target, body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%s answered %q, not the MS2M contract: %w", t, truncate(string(body)), err)
	}
	return nil
}

func callError(t Target, what string, err error, body []byte) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s %s: %w", t, what, err)
	}
	detail := strings.TrimSpace(string(body))
	if detail == "" {
		detail = err.Error()
	}
	if strings.Contains(detail, protocol.TokenHeader) || strings.Contains(detail, "no MS2M control token") {
		return fmt.Errorf("%s %s: the application refused the call: %s (it takes the token of Secret %s in its namespace as mounted when it started; restart it after changing the Secret)", t, what, truncate(detail), protocol.ControlSecret)
	}
	return fmt.Errorf("%s %s: %s (is the MS2M endpoint on port %d? set the port with the ms2m.io/control-port annotation or --control-port)", t, what, truncate(detail), t.Port)
}

func truncate(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}
