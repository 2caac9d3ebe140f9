package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	goruntime "runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations that mark a checkpoint image and name the container it holds.
// CRI-O restores only with the first; containerd 2.1–2.3 only with the second.
const (
	CRIOCheckpointAnnotation = "io.kubernetes.cri-o.annotations.checkpoint.name"
	CRIUCheckpointAnnotation = "org.criu.checkpoint.container.name"
)

// CheckpointImage packs the checkpoint archive at archivePath (a tar, as the
// kubelet writes it) as a one-layer OCI image for container. The image's
// platform is the one this process runs on, which is the node's.
func CheckpointImage(archivePath, container string) (v1.Image, error) {
	layer, err := NewFileLayer(archivePath)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint archive %s: %w", archivePath, err)
	}
	return CheckpointImageOf(layer, container)
}

// FileLayer is an uncompressed layer in a file, sent as it is: a checkpoint
// archive is read once to hash it and once to upload it, never compressed
// or copied on the way (the runtime unpacks it either way).
type FileLayer struct {
	Path string
	// Hash is the file's sha256, its digest and diff ID at once.
	Hash v1.Hash
	Len  int64
}

// NewFileLayer hashes the file at path.
func NewFileLayer(path string) (FileLayer, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileLayer{}, err
	}
	defer f.Close()
	h, n, err := v1.SHA256(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return FileLayer{}, err
	}
	return FileLayer{Path: path, Hash: h, Len: n}, nil
}

// The v1.Layer methods.
func (l FileLayer) Digest() (v1.Hash, error)             { return l.Hash, nil }
func (l FileLayer) DiffID() (v1.Hash, error)             { return l.Hash, nil }
func (l FileLayer) Size() (int64, error)                 { return l.Len, nil }
func (l FileLayer) MediaType() (types.MediaType, error)  { return types.OCIUncompressedLayer, nil }
func (l FileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.Path) }
func (l FileLayer) Uncompressed() (io.ReadCloser, error) { return os.Open(l.Path) }

// CheckpointImageOf is the checkpoint image of container whose one layer is
// the (uncompressed) checkpoint archive.
func CheckpointImageOf(archive v1.Layer, container string) (v1.Image, error) {
	img, err := ociImage(archive, func(cfg *v1.ConfigFile) { cfg.OS, cfg.Architecture = "linux", goruntime.GOARCH })
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, CheckpointAnnotations(container)).(v1.Image), nil
}

// ProbeImage is a tiny image with one empty layer: pulling it proves a node
// pulls from a registry, nothing more (it runs nothing of its own).
func ProbeImage() (v1.Image, error) {
	var empty bytes.Buffer
	if err := tar.NewWriter(&empty).Close(); err != nil {
		return nil, err
	}
	layer := static.NewLayer(empty.Bytes(), types.OCILayer)
	return ociImage(layer, func(cfg *v1.ConfigFile) { cfg.OS, cfg.Architecture = "linux", goruntime.GOARCH })
}

// ociImage is a one-layer image with OCI media types throughout (Docker media
// types mixed with OCI ones make CRI-O refuse an image: "invalid mixed OCI
// image"), its config adjusted by configure.
func ociImage(layer v1.Layer, configure func(*v1.ConfigFile)) (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	configure(cfg)
	return mutate.ConfigFile(img, cfg)
}

// CheckpointAnnotations are the manifest annotations of a checkpoint image.
func CheckpointAnnotations(container string) map[string]string {
	return map[string]string{
		CRIOCheckpointAnnotation: container,
		CRIUCheckpointAnnotation: container,
	}
}
