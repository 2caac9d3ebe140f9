package agent

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
)

// ServePort is where a serving agent listens (reached through the API
// server's pod proxy).
const ServePort = 8090

// Paths a serving agent answers.
const (
	healthPath  = "/healthz"
	packPath    = "/pack"
	removePath  = "/remove"
	pullPath    = "/pull"
	runtimePath = "/runtime"
	directPath  = "/direct"
	volumesPath = "/volumes"
	expectPath  = "/expect"
	bindPath    = "/bind"
)

// ControlTokenEnv carries a serving agent's control token: every call but
// the health check must present it (ControlTokenHeader), so that no pod that
// reaches the agent's port — any pod of the cluster network — can drive it.
const ControlTokenEnv = "KUBECTL_MIGRATE_CONTROL_TOKEN"

// ControlTokenHeader carries the control token in a call. Not
// Authorization: the API server's pod proxy is not meant to pass
// credentials to pods.
const ControlTokenHeader = "X-Kubectl-Migrate-Token"

// removeRequest names the archives (or archive patterns) to remove.
type removeRequest struct {
	Archives []string `json:"archives"`
}

// Handler serves the agent's work over HTTP: a warm agent started at the
// beginning of a migration packs and removes archives the moment they are
// asked for, with no pod start in between. touch is called on every request
// (the idle timer).
//
// With direct, the agent is also a direct transfer's target: it receives
// checkpoints and serves them to its node's runtime. It is healthy once
// ready is true. Every call but the health check and the direct transfer's
// (which has its own push token) must carry token, and one that does not
// is refused before it counts as activity. Whatever a call names, it
// touches only scope's pods, checkpoints and volumes.
func Handler(reg func(insecure bool) image.Registry, touch func(), direct *Direct, ready *atomic.Bool, token string, scope Scope) (http.Handler, error) {
	mux := http.NewServeMux()
	authorized := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if token == "" {
				http.Error(w, "this agent was started without a control token ($"+ControlTokenEnv+") and takes no calls", http.StatusForbidden)
				return
			}
			if subtle.ConstantTimeCompare([]byte(r.Header.Get(ControlTokenHeader)), []byte(token)) != 1 {
				http.Error(w, "this agent takes calls only from its migration", http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	mux.HandleFunc("GET "+healthPath, func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	if direct != nil {
		reg, _, err := direct.handlers()
		if err != nil {
			return nil, err
		}
		mux.Handle("/v2/", reg)
		mux.Handle("POST "+directPath, authorized(jsonCall(touch, "direct", func(context.Context, struct{}) (DirectInfo, error) {
			return DirectInfo{CertSHA256: direct.CertSHA256()}, nil
		})))
		mux.Handle("POST "+expectPath, authorized(jsonCall(touch, "expect", func(_ context.Context, req expectRequest) (struct{}, error) {
			if err := scope.allowIdentities(req.Containers); err != nil {
				return struct{}{}, err
			}
			return struct{}{}, direct.expect(req.Containers)
		})))
		mux.Handle("POST "+pagesResultPath, authorized(jsonCall(touch, "pages result", func(_ context.Context, req pagesResultRequest) ([]PagesStatus, error) {
			if err := scope.allowIdentities(req.Containers); err != nil {
				return nil, err
			}
			return direct.pagesResults(req.Containers)
		})))
		mux.Handle("POST "+bindPath, authorized(jsonCall(touch, "bind", func(_ context.Context, req bindRequest) (struct{}, error) {
			if err := scope.allowIdentities(req.Containers); err != nil {
				return struct{}{}, err
			}
			return struct{}{}, direct.bind(req.Containers)
		})))
	}
	mux.Handle("POST "+packPath, authorized(jsonCall(touch, "pack", func(ctx context.Context, req PackRequest) (PackResult, error) {
		if err := scope.allowPack(req); err != nil {
			return PackResult{}, err
		}
		res, err := Pack(ctx, req, reg(req.Insecure))
		if err == nil && req.Pages != nil {
			err = direct.streamPages(ctx, req)
		}
		return res, err
	})))
	mux.Handle("POST "+pullPath, authorized(jsonCall(touch, "pull", func(ctx context.Context, req pullRequest) (PullResult, error) {
		if err := haveRuntimeSocket(); err != nil {
			return PullResult{}, err
		}
		var auth *criv1.AuthConfig
		if direct != nil {
			auth = &criv1.AuthConfig{Username: PullUser, Password: PullPassword(direct.Token)}
		}
		return pullImages(ctx, runtimeSocketPath, req.Images, auth)
	})))
	mux.Handle("POST "+runtimePath, authorized(jsonCall(touch, "runtime", func(ctx context.Context, _ struct{}) (RuntimeInfo, error) {
		if err := haveRuntimeSocket(); err != nil {
			return RuntimeInfo{}, err
		}
		return runtimeInfo(ctx, runtimeSocketPath)
	})))
	mux.Handle("POST "+checkpointPath, authorized(jsonCall(touch, "checkpoint", func(ctx context.Context, req CheckpointRequest) (CheckpointResult, error) {
		if err := scope.allow(req.Namespace, "pod "+req.Pod); err != nil {
			return CheckpointResult{}, err
		}
		if err := haveRuntimeSocket(); err != nil {
			return CheckpointResult{}, err
		}
		stage := ""
		if direct != nil {
			stage = direct.StageDir
		}
		return checkpointContainer(ctx, runtimeSocketPath, stage, req, wait.Backoff{})
	})))
	mux.Handle("POST "+stopPodPath, authorized(jsonCall(touch, "stop pod", func(ctx context.Context, req stopPodRequest) (StopPodResult, error) {
		if err := scope.allowPodCall(ctx, "stop pod", req.UID); err != nil {
			return StopPodResult{}, err
		}
		return stopPod(ctx, runtimeSocketPath, req.UID)
	})))
	mux.Handle("POST "+fencePath, authorized(jsonCall(touch, "fence", func(ctx context.Context, req fenceRequest) (FenceResult, error) {
		if err := scope.allowPodCall(ctx, "fence", req.UID); err != nil {
			return FenceResult{}, err
		}
		return fencePod(ctx, runtimeSocketPath, req.UID, req.Lift)
	})))
	mux.Handle("POST "+volumesPath, authorized(jsonCall(touch, "volumes", func(ctx context.Context, req SnapshotRequest) (SnapshotResult, error) {
		if err := haveRuntimeSocket(); err != nil {
			return SnapshotResult{}, err
		}
		if err := scope.allowPod(ctx, runtimeSocketPath, req.PodUID); err != nil {
			return SnapshotResult{}, err
		}
		res, err := SnapshotVolumes(req, string(scope))
		if errors.Is(err, ErrTooLarge) {
			return res, statusError{http.StatusRequestEntityTooLarge, err.Error()}
		}
		return res, err
	})))
	mux.Handle("POST "+removePath, authorized(jsonCall(touch, "remove", func(_ context.Context, req removeRequest) (struct{}, error) {
		var errs []error
		for _, a := range req.Archives {
			if err := scope.allowArchive(a); err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, Remove(a))
		}
		return struct{}{}, errors.Join(errs...)
	})))
	return mux, nil
}

// haveRuntimeSocket says why this agent cannot reach its node's runtime.
func haveRuntimeSocket() error {
	if _, err := os.Stat(runtimeSocketPath); err != nil {
		return statusError{http.StatusNotImplemented, "this agent has no runtime socket: " + err.Error()}
	}
	return nil
}

// statusError is an error answered with its own HTTP status.
type statusError struct {
	status int
	msg    string
}

func (e statusError) Error() string { return e.msg }

// maxRequestBytes bounds a call's JSON body: the largest, a pull's list of
// images, is a few KiB.
const maxRequestBytes = 1 << 20

// jsonCall serves one of the agent's calls: it touches the idle timer,
// decodes the JSON request, and answers do's result as JSON or its error
// (500, or a statusError's status).
func jsonCall[Req, Res any](touch func(), what string, do func(context.Context, Req) (Res, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		touch()
		var req Req
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBytes)).Decode(&req); err != nil {
			http.Error(w, "malformed "+what+" request: "+err.Error(), http.StatusBadRequest)
			return
		}
		res, err := do(r.Context(), req)
		if err != nil {
			status := http.StatusInternalServerError
			var se statusError
			if errors.As(err, &se) {
				status = se.status
			}
			http.Error(w, err.Error(), status)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	})
}

// Serve runs the agent's HTTP server on ln until ctx ends or no request
// came for idle: a warm agent whose migration died ends on its own. With
// direct it also serves checkpoints to its node (ln must then be on the
// node's network, port DirectPort). Calls must carry token, and touch
// only scope's pods.
func Serve(ctx context.Context, ln net.Listener, idle time.Duration, direct *Direct, token string, scope Scope) error {
	activity := make(chan struct{}, 1)
	touch := func() {
		select {
		case activity <- struct{}{}:
		default:
		}
	}
	var ready atomic.Bool
	if direct != nil {
		direct.touch = touch
	}
	h, err := Handler(func(insecure bool) image.Registry { return image.Registry{Insecure: insecure} }, touch, direct, &ready, token, scope)
	if err != nil {
		return err
	}
	// Close does not wait for the handlers it cuts off; Serve does, so that
	// nothing writes under direct's directory once it returns.
	var inflight sync.WaitGroup
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inflight.Add(1)
		defer inflight.Done()
		h.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 10 * time.Second}
	var receiver *http.Server
	if direct != nil && direct.Receive != nil {
		_, receive, err := direct.handlers()
		if err != nil {
			return err
		}
		receiver = direct.receiveServer(receive)
		go func() {
			if err := receiver.ServeTLS(direct.Receive, "", ""); !errors.Is(err, http.ErrServerClosed) {
				log.Printf("receive: %v", err)
			}
		}()
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	probed := make(chan error, 1)
	if direct == nil {
		ready.Store(true)
		probed <- nil
	} else {
		go func() {
			// Published through the agent's own server, which must run.
			err := direct.publishProbe(ctx)
			probed <- err
			if err != nil {
				cancel()
				return
			}
			ready.Store(true)
		}()
	}
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
			if receiver != nil {
				_ = receiver.Close()
			}
			return
		}
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	inflight.Wait()
	if direct != nil {
		direct.publishes.Wait()
	}
	// A probe cut short by the end of the agent is no failure of it.
	if err := <-probed; err != nil && parent.Err() == nil {
		return fmt.Errorf("publish the probe image: %w", err)
	}
	return nil
}

// DirectPort is where a node's agent serves checkpoint images to the node's
// runtime (as localhost:DirectPort) in a transfer without a registry; the
// runtime must treat that registry as insecure (plain HTTP on loopback).
const DirectPort = 8091

// DirectRegistry is the registry a direct transfer's target node pulls from.
func DirectRegistry() string { return fmt.Sprintf("localhost:%d", DirectPort) }
