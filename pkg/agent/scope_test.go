package agent

import (
	"archive/tar"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// writeSpecArchive writes a checkpoint archive whose spec.dump carries
// annotations, as the runtime writes it.
func writeSpecArchive(t *testing.T, name string, annotations map[string]string) string {
	t.Helper()
	path := filepath.Join(archiveDir, name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	pages := make([]byte, 1<<20)
	spec, _ := json.Marshal(map[string]any{"annotations": annotations})
	for _, e := range []struct {
		name string
		body []byte
	}{{"checkpoint/pages-1.img", pages}, {"spec.dump", spec}} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o600, Size: int64(len(e.body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func crio(namespace string) map[string]string {
	return map[string]string{"io.kubernetes.cri-o.ContainerType": "container", "io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": "p", "io.kubernetes.container.name": "app"}
}

// TestAnAgentTouchesOnlyItsNamespacesArchives: pack and remove read whose
// an archive is from the archive itself (the runtime's spec.dump, or a
// volumes snapshot's own entry), so neither a name nor a pattern reaches
// another namespace's; on CRI-O, containerd's keys a pod copied into its
// spec name nothing.
func TestAnAgentTouchesOnlyItsNamespacesArchives(t *testing.T) {
	archiveDir = t.TempDir()
	t.Cleanup(func() { archiveDir = CheckpointDir })
	// Namespace "shop-eu" makes the name checkpoint-p_shop-eu-app-… look
	// like namespace "shop"'s, container "eu-app".
	theirs := writeSpecArchive(t, "checkpoint-p_shop-eu-app-1.tar", crio("shop-eu"))
	ours := writeSpecArchive(t, "checkpoint-p_shop-app-1.tar", crio("shop"))
	disguised := crio("shop-eu")
	disguised["io.kubernetes.cri.container-type"] = "container"
	disguised["io.kubernetes.cri.sandbox-namespace"] = "shop"
	copied := writeSpecArchive(t, "checkpoint-q_shop-eu-app-1.tar", disguised)
	containerd := writeSpecArchive(t, "checkpoint-c_shop-app-1.tar", map[string]string{
		"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-namespace": "shop", "io.kubernetes.cri.sandbox-name": "c", "io.kubernetes.cri.container-name": "app"})

	var scope Scope = "shop"
	for _, p := range []string{ours, containerd} {
		if err := scope.allowArchive(p); err != nil {
			t.Errorf("%s: %v", filepath.Base(p), err)
		}
	}
	for _, p := range []string{theirs, copied, archiveDir + "/checkpoint-*_shop-*.tar"} {
		if err := scope.allowArchive(p); err == nil || !strings.Contains(err.Error(), "acts for namespace shop only") {
			t.Errorf("%s: %v", filepath.Base(p), err)
		}
	}
	if err := RemoveInScope(archiveDir+"/checkpoint-*_shop-*.tar", scope); err == nil {
		t.Fatal("a pattern removed another namespace's archive")
	}
	if _, err := os.Stat(theirs); err != nil {
		t.Fatalf("another namespace's archive: %v", err)
	}
	if _, err := PackInScope(t.Context(), PackRequest{Archive: theirs, Container: "app", Image: "reg/x:1"}, image.Registry{}, scope); err == nil {
		t.Fatal("packed another namespace's archive")
	}
	if err := RemoveInScope(ours, scope); err != nil {
		t.Fatal(err)
	}
	if err := scope.allowArchive(ociruntime.StageDir + "/shop-eu/p/app"); err == nil {
		t.Fatal("a staged checkpoint of another namespace")
	}
	if err := Scope("").allowArchive(containerd); err == nil {
		t.Fatal("an agent without a namespace removes archives")
	}

	// A volumes snapshot says whose it is.
	dir := t.TempDir()
	podsDir = dir
	t.Cleanup(func() { podsDir = PodsDir })
	if err := os.MkdirAll(filepath.Join(dir, testUID, "volumes", "kubernetes.io~empty-dir", "scratch"), 0o755); err != nil {
		t.Fatal(err)
	}
	snapshot := filepath.Join(archiveDir, "checkpoint-p_shop-"+VolumesKey+"-1.tar")
	if _, err := SnapshotVolumes(SnapshotRequest{PodUID: testUID, Volumes: []string{"scratch"}, Archive: snapshot, MaxBytes: 1 << 20}, "shop"); err != nil {
		t.Fatal(err)
	}
	if err := scope.allowArchive(snapshot); err != nil {
		t.Fatal(err)
	}
	if err := Scope("shop-eu").allowArchive(snapshot); err == nil {
		t.Fatal("another namespace's agent may pack the snapshot")
	}
}

// TestAnAgentRefusesCallsForAnotherNamespace: with its migration's token,
// a call naming another namespace's pod is refused before the runtime is
// asked anything.
func TestAnAgentRefusesCallsForAnotherNamespace(t *testing.T) {
	var ready atomic.Bool
	ready.Store(true)
	h, err := Handler(nil, func() {}, nil, &ready, "control", "shop")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for path, body := range map[string]string{
		checkpointPath: `{"namespace":"bank","pod":"ledger","uid":"u","container":"app"}`,
		packPath:       `{"Archive":"/var/lib/kubelet/checkpoints/x.tar","StageAs":{"namespace":"bank","pod":"ledger","container":"app"}}`,
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set(ControlTokenHeader, "control")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s for another namespace: %d", path, resp.StatusCode)
		}
	}
}
