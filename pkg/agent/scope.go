package agent

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// Scope is the one application namespace whose pods, checkpoints and
// volumes an agent may touch: its request's (AppNamespaceEnv), which the
// admission policy checked the requester may migrate. A migrator's token
// so opens nothing of another namespace's, whatever the call names.
type Scope string

// ScopeFromEnv is the scope the controller gave this agent.
func ScopeFromEnv() Scope { return Scope(os.Getenv(AppNamespaceEnv)) }

// allow refuses namespace unless it is the scope's.
func (s Scope) allow(namespace, what string) error {
	if s == "" {
		return statusError{http.StatusForbidden, "this agent acts for no namespace ($" + AppNamespaceEnv + ") and touches no " + what}
	}
	if namespace != string(s) {
		return statusError{http.StatusForbidden, fmt.Sprintf("this agent acts for namespace %s only, not on %s in namespace %q", s, what, namespace)}
	}
	return nil
}

// allowPodCall refuses a call about the pod with uid that this agent cannot
// make (no runtime socket, no UID) or may not (a pod of another namespace).
func (s Scope) allowPodCall(ctx context.Context, call, uid string) error {
	if err := haveRuntimeSocket(); err != nil {
		return err
	}
	if uid == "" {
		return statusError{http.StatusBadRequest, call + ": no pod UID given"}
	}
	return s.allowPod(ctx, runtimeSocketPath, uid)
}

// allowPod refuses a pod UID whose sandboxes the node's runtime places in
// another namespace (the kubelet names each sandbox's namespace).
func (s Scope) allowPod(ctx context.Context, socket, uid string) error {
	conn, err := dialRuntime(socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	list, err := criv1.NewRuntimeServiceClient(conn).ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{Filter: &criv1.PodSandboxFilter{LabelSelector: map[string]string{podUIDLabel: uid}}})
	if err != nil {
		return fmt.Errorf("ask the runtime for the sandboxes of pod %s: %w", uid, err)
	}
	for _, sb := range list.GetItems() {
		if err := s.allow(sb.GetMetadata().GetNamespace(), "pod "+uid); err != nil {
			return err
		}
	}
	return nil
}

// NamespaceEntry is the first entry of a volumes snapshot: the namespace of
// the pod it was taken from, as a checkpoint archive's spec.dump says its
// container's. No runtime writes such an entry at an archive's top.
const NamespaceEntry = ".kubectl-migrate-namespace"

// allowArchive refuses an archive (or each archive a pattern matches) of
// another namespace's container, as the archive itself says: the
// runtime's spec.dump, or a volumes snapshot's NamespaceEntry. An archive
// that is gone passes (removing it again is no harm); a staged checkpoint
// is named by its identity.
func (s Scope) allowArchive(path string) error {
	if id, ok := stagedIdentity(path); ok {
		return s.allow(id.Namespace, "staged checkpoint")
	}
	paths, err := expandArchives(path)
	if err != nil {
		return err
	}
	for _, p := range paths {
		ns, err := archiveNamespace(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return statusError{http.StatusForbidden, fmt.Sprintf("archive %s: %v", p, err)}
		}
		if err := s.allow(ns, "archive "+filepath.Base(p)); err != nil {
			return err
		}
	}
	return nil
}

// archiveNamespace reads whose an archive is.
func archiveNamespace(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	// A file is a Seeker: Next skips over the memory pages unread.
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return "", errors.New("names no namespace (no spec.dump)")
		}
		if err != nil {
			return "", err
		}
		switch strings.TrimPrefix(h.Name, "./") {
		case NamespaceEntry:
			b, err := io.ReadAll(io.LimitReader(tr, 256))
			return strings.TrimSpace(string(b)), err
		case "spec.dump":
			var spec struct {
				Annotations map[string]string `json:"annotations"`
			}
			if err := json.NewDecoder(io.LimitReader(tr, 16<<20)).Decode(&spec); err != nil {
				return "", fmt.Errorf("spec.dump: %w", err)
			}
			id, ok := ociruntime.IdentityOf("", spec.Annotations)
			if !ok {
				return "", errors.New("spec.dump names no container")
			}
			return id.Namespace, nil
		}
	}
}

// allowIdentities refuses staging for another namespace's containers.
func (s Scope) allowIdentities(ids []ociruntime.Identity) error {
	for _, id := range ids {
		if err := s.allow(id.Namespace, "checkpoint of "+id.Pod); err != nil {
			return err
		}
	}
	return nil
}

// allowPack refuses to pack another namespace's archive, or to stage it
// for another namespace's container.
func (s Scope) allowPack(req PackRequest) error {
	if req.StageAs != nil {
		if err := s.allowIdentities([]ociruntime.Identity{*req.StageAs}); err != nil {
			return err
		}
	}
	return s.allowArchive(req.Archive)
}

// PackInScope is Pack for an agent of scope (the one-shot pack command).
func PackInScope(ctx context.Context, req PackRequest, reg image.Registry, scope Scope) (PackResult, error) {
	if err := scope.allowPack(req); err != nil {
		return PackResult{}, err
	}
	return Pack(ctx, req, reg)
}

// RemoveInScope is Remove for an agent of scope (the one-shot remove
// command).
func RemoveInScope(path string, scope Scope) error {
	if err := scope.allowArchive(path); err != nil {
		return err
	}
	return Remove(path)
}
