// Command release supports test/release/check.sh, which checks the release
// offline: "base REF" pushes an empty multi-arch base image for ko to build
// the images on (the real release uses a public static base the check
// cannot reach), and "image REF BINARY" checks an image the release pushed
// (the agent's, the sample applications'), and "serve DIST ADDR-FILE" serves
// a GitHub release's download layout of what goreleaser put in DIST on
// loopback, for krew to install from as a user would.
package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// platforms are the release images'.
var platforms = []string{"linux/amd64", "linux/arm64"}

func main() {
	var err error
	switch {
	case len(os.Args) == 3 && os.Args[1] == "base":
		err = pushBase(os.Args[2])
	case len(os.Args) == 4 && os.Args[1] == "image":
		err = checkImage(os.Args[2], os.Args[3])
	case len(os.Args) == 4 && os.Args[1] == "serve":
		err = serveRelease(os.Args[2], os.Args[3])
	default:
		fmt.Fprintln(os.Stderr, "usage: release base IMAGE-REF | release image IMAGE-REF BINARY | release serve DIST ADDR-FILE")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func pushBase(ref string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	index := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		goos, arch, _ := strings.Cut(p, "/")
		img, err := mutate.ConfigFile(mutate.MediaType(empty.Image, types.OCIManifestSchema1), &v1.ConfigFile{OS: goos, Architecture: arch})
		if err != nil {
			return err
		}
		index = mutate.AppendManifests(index, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: goos, Architecture: arch}}})
	}
	return remote.WriteIndex(tag, index)
}

// checkImage checks that ref is an index for every platform, each running
// binary.
func checkImage(ref, binary string) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	index, err := remote.Index(r)
	if err != nil {
		return err
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		return err
	}
	var found []string
	for _, m := range manifest.Manifests {
		if m.Platform == nil {
			continue
		}
		img, err := index.Image(m.Digest)
		if err != nil {
			return err
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			return err
		}
		p := m.Platform.OS + "/" + m.Platform.Architecture
		if len(cfg.Config.Entrypoint) == 0 || !strings.HasSuffix(cfg.Config.Entrypoint[0], "/"+binary) {
			return fmt.Errorf("%s image of %s does not run %s: entrypoint %v", p, ref, binary, cfg.Config.Entrypoint)
		}
		found = append(found, p)
	}
	slices.Sort(found)
	if !slices.Equal(found, platforms) {
		return fmt.Errorf("%s has platforms %v, want %v", ref, found, platforms)
	}
	fmt.Printf("image %s runs %s: %s\n", ref, binary, strings.Join(found, ", "))
	return nil
}
