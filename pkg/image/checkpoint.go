package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	goruntime "runtime"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/stream"
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
	layer, err := ArchiveLayer(archivePath)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint archive %s: %w", archivePath, err)
	}
	return CheckpointImageOf(layer, container)
}

// ArchiveLayer is the archive (a tar) at path as an uncompressed layer,
// hashed as it is pushed.
func ArchiveLayer(path string) (v1.Layer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	return &streamedLayer{path: path, size: fi.Size()}, nil
}

// FileLayer is an uncompressed layer in a file whose hash is known (it was
// computed as the file was received).
type FileLayer struct {
	Path string
	// Hash is the file's sha256, its digest and diff ID at once.
	Hash v1.Hash
	Len  int64
}

// The v1.Layer methods.
func (l FileLayer) Digest() (v1.Hash, error)             { return l.Hash, nil }
func (l FileLayer) DiffID() (v1.Hash, error)             { return l.Hash, nil }
func (l FileLayer) Size() (int64, error)                 { return l.Len, nil }
func (l FileLayer) MediaType() (types.MediaType, error)  { return types.OCIUncompressedLayer, nil }
func (l FileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.Path) }
func (l FileLayer) Uncompressed() (io.ReadCloser, error) { return os.Open(l.Path) }

// streamedLayer is an uncompressed layer in a file, sent as it is and hashed
// on the way: the checkpoint archive is read once, never compressed or
// copied (the runtime unpacks it either way). Until it has been read, its
// digest is stream.ErrNotComputed, which makes the registry client upload it
// first and ask after.
type streamedLayer struct {
	path string
	size int64

	mu   sync.Mutex
	hash v1.Hash
}

func (l *streamedLayer) Digest() (v1.Hash, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hash.Hex == "" {
		return v1.Hash{}, stream.ErrNotComputed
	}
	return l.hash, nil
}

func (l *streamedLayer) DiffID() (v1.Hash, error)             { return l.Digest() }
func (l *streamedLayer) Size() (int64, error)                 { return l.size, nil }
func (l *streamedLayer) MediaType() (types.MediaType, error)  { return types.OCIUncompressedLayer, nil }
func (l *streamedLayer) Uncompressed() (io.ReadCloser, error) { return l.Compressed() }

// Compressed (the layer as stored: here the file as it is) hashes what is
// read and keeps the hash once the whole file was.
func (l *streamedLayer) Compressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	return &hashingReader{f: f, h: sha256.New(), done: func(sum []byte, n int64) {
		if n != l.size {
			return
		}
		l.mu.Lock()
		l.hash = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum)}
		l.mu.Unlock()
	}}, nil
}

type hashingReader struct {
	f    *os.File
	h    hash.Hash
	n    int64
	done func(sum []byte, n int64)
}

func (r *hashingReader) Read(p []byte) (int, error) {
	n, err := r.f.Read(p)
	r.h.Write(p[:n])
	r.n += int64(n)
	if err == io.EOF && r.done != nil {
		r.done(r.h.Sum(nil), r.n)
		r.done = nil
	}
	return n, err
}

func (r *hashingReader) Close() error { return r.f.Close() }

// CheckpointImageOf is the checkpoint image of container whose one layer is
// the (uncompressed) checkpoint archive.
func CheckpointImageOf(archive v1.Layer, container string) (v1.Image, error) {
	img, err := OCIImage(func(cfg *v1.ConfigFile) { cfg.OS, cfg.Architecture = "linux", goruntime.GOARCH }, archive)
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
	return OCIImage(func(cfg *v1.ConfigFile) { cfg.OS, cfg.Architecture = "linux", goruntime.GOARCH }, layer)
}

// OCIImage is an image of layers with OCI media types throughout (Docker
// media types mixed with OCI ones make CRI-O refuse an image: "invalid mixed
// OCI image"), its config adjusted by configure.
func OCIImage(configure func(*v1.ConfigFile), layers ...v1.Layer) (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	cfg, err := base.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	configure(cfg)
	// Configured before the layer is added: a streamed layer's diff ID is
	// known only once it has been uploaded.
	if base, err = mutate.ConfigFile(base, cfg); err != nil {
		return nil, err
	}
	return mutate.AppendLayers(base, layers...)
}

// CheckpointAnnotations are the manifest annotations of a checkpoint image.
func CheckpointAnnotations(container string) map[string]string {
	return map[string]string{
		CRIOCheckpointAnnotation: container,
		CRIUCheckpointAnnotation: container,
	}
}
