package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
)

// ServePort is where a serving agent listens (reached through the API
// server's pod proxy).
const ServePort = 8090

// Paths a serving agent answers.
const (
	healthPath = "/healthz"
	packPath   = "/pack"
	removePath = "/remove"
)

// removeRequest names the archives (or archive patterns) to remove.
type removeRequest struct {
	Archives []string `json:"archives"`
}

// Handler serves the agent's work over HTTP: a warm agent started at the
// beginning of a migration packs and removes archives the moment they are
// asked for, with no pod start in between. touch is called on every request
// (the idle timer).
func Handler(reg func(insecure bool) image.Registry, touch func()) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+healthPath, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("POST "+packPath, func(w http.ResponseWriter, r *http.Request) {
		touch()
		var req PackRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "malformed pack request: "+err.Error(), http.StatusBadRequest)
			return
		}
		res, err := Pack(r.Context(), req, reg(req.Insecure))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	})
	mux.HandleFunc("POST "+removePath, func(w http.ResponseWriter, r *http.Request) {
		touch()
		var req removeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "malformed remove request: "+err.Error(), http.StatusBadRequest)
			return
		}
		var errs []error
		for _, a := range req.Archives {
			errs = append(errs, Remove(a))
		}
		if err := errors.Join(errs...); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return mux
}

// Serve runs the agent's HTTP server on ln until ctx ends or no request
// came for idle: a warm agent whose migration died ends on its own.
func Serve(ctx context.Context, ln net.Listener, idle time.Duration) error {
	activity := make(chan struct{}, 1)
	touch := func() {
		select {
		case activity <- struct{}{}:
		default:
		}
	}
	srv := &http.Server{
		Handler:           Handler(func(insecure bool) image.Registry { return image.Registry{Insecure: insecure} }, touch),
		ReadHeaderTimeout: 10 * time.Second,
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		timer := time.NewTimer(idle)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
			case <-timer.C:
				cancel()
			case <-activity:
				timer.Reset(idle)
				continue
			}
			_ = srv.Close()
			return
		}
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
