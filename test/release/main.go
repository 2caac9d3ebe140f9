// Command release supports test/release/check.sh, which checks the release
// offline: "base REF" pushes an empty multi-arch base image for ko to build
// the agent image on (the real release uses a public static base the check
// cannot reach), and "agent REF" checks the agent image the release pushed.
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

// platforms are the agent image's.
var platforms = []string{"linux/amd64", "linux/arm64"}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: release base|agent IMAGE-REF")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "base":
		err = pushBase(os.Args[2])
	case "agent":
		err = checkAgent(os.Args[2])
	default:
		err = fmt.Errorf("unknown command %q; use base or agent", os.Args[1])
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

// checkAgent checks that ref is an index of the agent for every platform,
// each running the agent binary.
func checkAgent(ref string) error {
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
		if len(cfg.Config.Entrypoint) == 0 || !strings.HasSuffix(cfg.Config.Entrypoint[0], "kubectl-migrate-agent") {
			return fmt.Errorf("%s image of %s does not run the agent: entrypoint %v", p, ref, cfg.Config.Entrypoint)
		}
		found = append(found, p)
	}
	slices.Sort(found)
	if !slices.Equal(found, platforms) {
		return fmt.Errorf("%s has platforms %v, want %v", ref, found, platforms)
	}
	fmt.Printf("agent image %s: %s\n", ref, strings.Join(found, ", "))
	return nil
}
