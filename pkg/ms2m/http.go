package ms2m

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// Handler serves the contract's HTTP endpoints: GET StatePath, POST
// ControlPath and GET AppliedPath?after=SEQ[&producer=ID], each only to
// callers with the control token (TokenHeader); and the health endpoints.
func (c *Consumer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+protocol.StatePath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, c.State())
	})
	mux.HandleFunc("POST "+protocol.ControlPath, func(w http.ResponseWriter, r *http.Request) {
		var msg protocol.Control
		if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
			http.Error(w, "malformed control message: "+err.Error(), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		st, err := c.Control(ctx, msg)
		if err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		writeJSON(w, http.StatusOK, st)
	})
	mux.HandleFunc("GET "+protocol.AppliedPath, func(w http.ResponseWriter, r *http.Request) {
		after, err := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
		if err != nil {
			http.Error(w, "after must be a sequence number", http.StatusBadRequest)
			return
		}
		a, ok := c.AppliedAfter(protocol.Position{Producer: r.URL.Query().Get("producer"), Seq: after})
		if !ok {
			http.Error(w, "nothing applied after that sequence yet", http.StatusNotFound)
			return
		}
		writeJSON(w, http.StatusOK, a)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	// Ready while it consumes: a stopped or held copy is alive but serves
	// nothing, which a readiness probe should show.
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if st := c.State(); st.Mode == protocol.ModeHold {
			http.Error(w, "holding: "+string(st.Mode), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return requireToken(c.token, c.tokenErr, mux)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
