package image

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
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

// Delete removes the image at ref (a digest reference): its manifest, then
// its config and layer blobs, which in a checkpoint image are the process's
// memory and nothing else's. A registry that refuses blob deletes (most do
// unless configured to) keeps them, unreachable by any tag, until its
// garbage collection; that is not an error.
func (r Registry) Delete(ctx context.Context, ref string) error {
	parsed, err := r.ParseReference(ref)
	if err != nil {
		return err
	}
	var blobs []v1.Hash
	if img, err := remote.Image(parsed, r.options(ctx)...); err == nil {
		if m, err := img.Manifest(); err == nil {
			blobs = append(blobs, m.Config.Digest)
			for _, l := range m.Layers {
				blobs = append(blobs, l.Digest)
			}
		}
	}
	if err := remote.Delete(parsed, r.options(ctx)...); err != nil {
		return fmt.Errorf("delete %s: %w", ref, err)
	}
	for _, h := range blobs {
		if err := r.deleteBlob(ctx, parsed.Context(), h); err != nil {
			return fmt.Errorf("delete %s: %w", ref, err)
		}
	}
	return nil
}

// deleteBlob deletes blob h from repo (go-containerregistry has manifest
// deletes only; its transport does the registry's authentication).
func (r Registry) deleteBlob(ctx context.Context, repo name.Repository, h v1.Hash) error {
	kc := r.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	auth, err := authn.Resolve(ctx, kc, repo)
	if err != nil {
		return err
	}
	base := r.Transport
	if base == nil {
		base = remote.DefaultTransport
	}
	t, err := transport.NewWithContext(ctx, repo.Registry, auth, base, []string{repo.Scope(transport.DeleteScope)})
	if err != nil {
		return err
	}
	u := url.URL{Scheme: repo.Scheme(), Host: repo.RegistryStr(), Path: fmt.Sprintf("/v2/%s/blobs/%s", repo.RepositoryStr(), h)}
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: t}).Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	switch resp.StatusCode {
	case http.StatusAccepted, http.StatusOK, http.StatusNoContent, http.StatusNotFound:
		return nil // gone, or was already
	case http.StatusMethodNotAllowed, http.StatusUnsupportedMediaType:
		return nil // the registry keeps blobs until its garbage collection
	}
	return transport.CheckError(resp, http.StatusAccepted)
}
