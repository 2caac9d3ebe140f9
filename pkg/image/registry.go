package image

import (
	"context"
	"fmt"
	"net/http"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry pushes, checks and deletes images with one keychain.
type Registry struct {
	Keychain authn.Keychain
	// Insecure allows plain HTTP (and untrusted TLS) registries.
	Insecure bool
	// Transport is the base transport; nil means http.DefaultTransport.
	Transport http.RoundTripper
}

// ParseReference parses ref honouring r.Insecure.
func (r Registry) ParseReference(ref string) (name.Reference, error) {
	var opts []name.Option
	if r.Insecure {
		opts = append(opts, name.Insecure)
	}
	return name.ParseReference(ref, opts...)
}

func (r Registry) options(ctx context.Context) []remote.Option {
	kc := r.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc)}
	if r.Transport != nil {
		opts = append(opts, remote.WithTransport(r.Transport))
	}
	return opts
}

// Push writes img to ref and returns the pushed digest reference.
func (r Registry) Push(ctx context.Context, ref string, img v1.Image) (string, error) {
	tag, err := r.ParseReference(ref)
	if err != nil {
		return "", err
	}
	if err := remote.Write(tag, img, r.options(ctx)...); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	return tag.Context().Digest(digest.String()).String(), nil
}

// Pull reads the image at ref.
func (r Registry) Pull(ctx context.Context, ref string) (v1.Image, error) {
	parsed, err := r.ParseReference(ref)
	if err != nil {
		return nil, err
	}
	return remote.Image(parsed, r.options(ctx)...)
}

// CheckPush verifies that repo (e.g. "registry.example:5000/checkpoints")
// is reachable and accepts pushes with the keychain, without pushing an image.
func (r Registry) CheckPush(ctx context.Context, repo string) error {
	ref, err := r.ParseReference(repo + ":kubectl-migrate-preflight")
	if err != nil {
		return fmt.Errorf("registry %q: %w", repo, err)
	}
	kc := r.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	t := r.Transport
	if t == nil {
		t = http.DefaultTransport
	}
	if err := remote.CheckPushPermission(ref, kc, t); err != nil {
		return fmt.Errorf("registry %s does not accept pushes: %w", repo, err)
	}
	return nil
}

// Delete removes the manifest at ref (a digest reference).
func (r Registry) Delete(ctx context.Context, ref string) error {
	parsed, err := r.ParseReference(ref)
	if err != nil {
		return err
	}
	if err := remote.Delete(parsed, r.options(ctx)...); err != nil {
		return fmt.Errorf("delete %s: %w", ref, err)
	}
	return nil
}
