package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// hostCABundle is added to binary images when present, so that a binary
// pushing to a TLS registry trusts what the building machine trusts.
const hostCABundle = "/etc/ssl/certs/ca-certificates.crt"

// BinaryImage returns an OCI image holding only the static binary at
// binaryPath, installed as /usr/local/bin/<name> and used as entrypoint,
// plus the building host's CA bundle if it has one.
func BinaryImage(binaryPath, arch string) (v1.Image, error) {
	bin, err := os.ReadFile(binaryPath)
	if err != nil {
		return nil, err
	}
	target := path.Join("/usr/local/bin", path.Base(binaryPath))
	files := []file{{name: target, mode: 0o755, data: bin}}
	if ca, err := os.ReadFile(hostCABundle); err == nil {
		files = append(files, file{name: hostCABundle, mode: 0o644, data: ca})
	}
	layerTar, err := tarFiles(files)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	return OCIImage(func(cfg *v1.ConfigFile) {
		cfg.OS, cfg.Architecture = "linux", arch
		cfg.Config.Entrypoint = []string{target}
		cfg.Config.Env = []string{"PATH=/usr/local/bin", "SSL_CERT_FILE=" + hostCABundle}
	}, layer)
}

type file struct {
	name string
	mode int64
	data []byte
}

func tarFiles(files []file) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		for d := path.Dir(f.name); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for _, d := range sortedKeys(dirs) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name[1:], Mode: f.mode, Size: int64(len(f.data))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("write %s: %w", f.name, err)
		}
	}
	return buf.Bytes(), tw.Close()
}
