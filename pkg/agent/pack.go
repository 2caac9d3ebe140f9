package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// CheckpointDir is where the kubelet writes checkpoint archives.
const CheckpointDir = "/var/lib/kubelet/checkpoints"

// archiveDir is CheckpointDir; tests point it at a temporary directory.
var archiveDir = CheckpointDir

// PackRequest says what to pack and where to push it: to a registry
// (Image), or straight to the target node's agent (SendTo).
type PackRequest struct {
	Archive     string // absolute path under CheckpointDir
	Container   string
	Image       string // tag reference to push to
	Insecure    bool
	KeepArchive bool

	// SendTo is the target node's agent (host:port) for a transfer without
	// a registry; it publishes the image as Repository:Tag for its node.
	SendTo     string `json:"sendTo,omitempty"`
	Repository string `json:"repository,omitempty"`
	Tag        string `json:"tag,omitempty"`
	// Token is the target agent's push credential, CertSHA256 the
	// fingerprint of its TLS certificate (DirectInfo), which the sender
	// pins.
	Token      string `json:"token,omitempty"`
	CertSHA256 string `json:"certSHA256,omitempty"`
	// StageAs has the target's agent stage the checkpoint for the
	// kubectl-migrate runtime to restore as this container, instead of
	// serving it as an image: into the pod of StageAs.UID only, or, with
	// no UID (the pod does not exist yet), once Bind names it.
	StageAs *ociruntime.Identity `json:"stageAs,omitempty"`
	// Pages, with StageAs, is the source container whose checkpoint was
	// lazy: its pages wait on this node, and follow in a second stream
	// once the archive is sent (Direct.streamPages).
	Pages *ociruntime.Identity `json:"pages,omitempty"`
}

// PackResult is what the agent reports back, as JSON in its termination
// message.
type PackResult struct {
	Image        string `json:"image"` // digest reference; with a direct transfer, the tag its node pulls
	ArchiveBytes int64  `json:"archiveBytes"`
	BuildMillis  int64  `json:"buildMillis"`
	PushMillis   int64  `json:"pushMillis"`
	// Staged is where the target's agent staged the checkpoint (StageAs).
	Staged string `json:"staged,omitempty"`
}

// ValidateArchive refuses paths outside CheckpointDir: the agent runs as root
// with that directory mounted and must not be talked into reading or
// deleting anything else.
func ValidateArchive(path string) error {
	clean := filepath.Clean(path)
	if !filepath.IsAbs(clean) || !strings.HasPrefix(clean, archiveDir+"/") || !strings.HasSuffix(clean, ".tar") {
		return fmt.Errorf("archive %q is not a .tar under %s", path, archiveDir)
	}
	return nil
}

// Pack builds the checkpoint image from the archive, pushes it and, unless
// asked to keep it, deletes the archive (it holds the process's memory).
func Pack(ctx context.Context, req PackRequest, reg image.Registry) (PackResult, error) {
	if err := ValidateArchive(req.Archive); err != nil {
		return PackResult{}, err
	}
	if req.isDirect() {
		res, err := send(ctx, req)
		if err != nil {
			return PackResult{}, err
		}
		return res, removeAfterPush(req, res.Image)
	}
	start := time.Now()
	layer, err := image.ArchiveLayer(req.Archive)
	if err != nil {
		return PackResult{}, fmt.Errorf("checkpoint archive: %w", err)
	}
	size, err := layer.Size()
	if err != nil {
		return PackResult{}, err
	}
	img, err := imageOf(layer, req.Container)
	if err != nil {
		return PackResult{}, err
	}
	// The archive is hashed as it is pushed: building is only the manifest.
	built := time.Now()
	ref, err := reg.Push(ctx, req.Image, img)
	if err != nil {
		return PackResult{}, err
	}
	res := PackResult{
		Image:        ref,
		ArchiveBytes: size,
		BuildMillis:  built.Sub(start).Milliseconds(),
		PushMillis:   time.Since(built).Milliseconds(),
	}
	return res, removeAfterPush(req, ref)
}

// removeAfterPush deletes the archive once its image is out, unless asked
// to keep it.
func removeAfterPush(req PackRequest, ref string) error {
	if req.KeepArchive {
		return nil
	}
	if err := os.Remove(req.Archive); err != nil {
		return fmt.Errorf("pushed %s but could not delete the archive: %w", ref, err)
	}
	return nil
}

// Remove deletes a checkpoint archive (rollback and cleanup), or every
// archive a pattern matches (ArchivePattern: a checkpoint whose path the
// migration never learnt, because the process running it died during the
// kubelet's call), or a checkpoint staged for the runtime (StagedPath).
func Remove(path string) error {
	if id, ok := stagedIdentity(path); ok {
		return removeStagedAll(stageDir, id)
	}
	if err := ValidateArchive(path); err != nil {
		return err
	}
	paths, err := expandArchives(path)
	if err != nil {
		return err
	}
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}

// ArchivePattern matches the archives the kubelet writes for a checkpoint
// of container in namespace/pod (checkpoint-POD_NAMESPACE-CONTAINER-TIME.tar).
func ArchivePattern(namespace, pod, container string) string {
	return archiveDir + "/checkpoint-" + pod + "_" + namespace + "-" + container + "-*.tar"
}

// InstallSelf copies the running (static) binary into dir, so a container
// of any other image can run it from a shared volume.
func InstallSelf(dir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(self)
	if err != nil {
		return "", err
	}
	dest := filepath.Join(dir, filepath.Base(self))
	if err := os.WriteFile(dest, data, 0o755); err != nil {
		return "", err
	}
	return "installed " + dest, nil
}

// imageOf is the image of an archive's layer, packed here or received by a
// direct transfer: a container's checkpoint image, or for VolumesKey the
// image that refills the emptyDir volumes with this binary as its tool.
func imageOf(layer v1.Layer, container string) (v1.Image, error) {
	if container != VolumesKey {
		return image.CheckpointImageOf(layer, container)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return image.VolumeImage(self, layer)
}

// expandArchives is the archives path names: itself, or those its pattern
// matches.
func expandArchives(path string) ([]string, error) {
	if strings.ContainsAny(path, "*?[") {
		return filepath.Glob(path)
	}
	return []string{path}, nil
}
