package image

import (
	"fmt"
	"os"
	goruntime "runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where a volume image keeps its parts: the snapshot's files under
// VolumesRoot/NAME, the copying tool at VolumeTool, and the emptyDir volumes
// to fill mounted under VolumeMounts/NAME in the init container that runs it.
const (
	VolumesRoot  = "/ms2m/volumes"
	VolumeMounts = "/ms2m/mnt"
	VolumeTool   = "/ms2m/fill"
)

// VolumeImage is the image that refills a migrated pod's emptyDir volumes
// on the target node before its containers are restored: data is the
// snapshot (an uncompressed layer of files under VolumesRoot), and the static
// binary at toolPath, installed as VolumeTool, copies them when run with
// "fill-volumes". The tool's layer is the same bytes on every node running
// one build, so registries and nodes keep it once.
func VolumeImage(toolPath string, data v1.Layer) (v1.Image, error) {
	bin, err := os.ReadFile(toolPath)
	if err != nil {
		return nil, fmt.Errorf("read the volume tool: %w", err)
	}
	toolTar, err := tarFiles([]file{{name: VolumeTool, mode: 0o755, data: bin}})
	if err != nil {
		return nil, err
	}
	// Uncompressed: gzip of the binary would cost a second per migration.
	tool := static.NewLayer(toolTar, types.OCIUncompressedLayer)
	return OCIImage(func(cfg *v1.ConfigFile) {
		cfg.OS, cfg.Architecture = "linux", goruntime.GOARCH
		cfg.Config.Entrypoint = []string{VolumeTool, "fill-volumes", VolumesRoot, VolumeMounts}
	}, tool, data)
}
