package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// CanaryPort is where a canary answers its state (protocol.StatePath).
const CanaryPort = 8092

// canaryPing is how often a canary pings over the connection it holds.
const canaryPing = 100 * time.Millisecond

// RunCanary is the stand-in workload of kubectl migrate check: a process
// with state only in memory (a random process ID, drawn at start) that
// holds an established TCP connection and pings over it. It answers like an
// MS2M instance: Process survives a checkpoint/restore and changes on a
// restart; LastSeq counts pings that went round the connection, so it grows
// after a restore only if the process runs on and its connection works
// again; Reconnects counts connections that broke (a restore with CRIU's
// tcp-close closes the one it held).
func RunCanary(ctx context.Context, port int) error {
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		return err
	}
	state := protocol.State{Mode: protocol.ModePrimary, Process: hex.EncodeToString(id), StartedAt: time.Now().UTC()}
	var pings, reconnects atomic.Uint64

	echo, err := ms2m.Listen(ctx, "127.0.0.1:0") // without MPTCP, which CRIU cannot dump

	if err != nil {
		return err
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	go func() {
		var conn net.Conn
		buf := make([]byte, 1)
		tick := time.NewTicker(canaryPing)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if conn == nil {
				if conn, err = net.DialTimeout("tcp", echo.Addr().String(), time.Second); err != nil {
					conn = nil
					continue
				}
			}
			_ = conn.SetDeadline(time.Now().Add(time.Second))
			if _, err := conn.Write([]byte{'.'}); err == nil {
				_, err = io.ReadFull(conn, buf)
				if err == nil {
					pings.Add(1)
					continue
				}
			}
			conn.Close()
			conn = nil
			reconnects.Add(1)
		}
	}()

	mux := http.NewServeMux()
	mux.HandleFunc("GET "+protocol.StatePath, func(w http.ResponseWriter, _ *http.Request) {
		st := state
		st.LastSeq, st.Reconnects = pings.Load(), reconnects.Load()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	ln, err := ms2m.Listen(ctx, ":"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// CanaryPod is the pod of a canary on node: the agent image in canary mode,
// nothing mounted and nothing privileged, so that it checks the path a
// plain workload takes.
func CanaryPod(namespace, podName, node, image string, labels map[string]string) *corev1.Pod {
	return nodePod(podName, namespace, node, labels, corev1.Container{
		Name:            "canary",
		Image:           image,
		Args:            []string{"canary"},
		ImagePullPolicy: corev1.PullIfNotPresent,
		Ports:           []corev1.ContainerPort{{ContainerPort: CanaryPort}},
	})
}
