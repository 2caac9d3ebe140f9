#!/usr/bin/env bash
# Checks the release offline, as a user would install it:
#  1. goreleaser check;
#  2. a full local release of a throwaway tag, in a temporary clone of HEAD:
#     all six archives, checksums, the krew manifest, and the multi-arch agent
#     image built with ko and pushed to the loopback registry (on an empty
#     base, as the public static base is out of reach; the GitHub release
#     itself is disabled). goreleaser --snapshot cannot stand in: it hands ko
#     images to a Docker daemon;
#  3. the agent image's platforms and entrypoint;
#  4. krew's manifest validator, and krew/migrate.yaml in sync with the
#     generated manifest;
#  5. kubectl krew install --manifest --archive into a temporary KREW_ROOT,
#     then kubectl migrate version and shell completion through kubectl.
# Needs the registry from test/services.sh (MIGRATE_TEST_REGISTRY) and kubectl
# (KUBECTL); installs goreleaser and krew from the Go module proxy into
# RELEASE_TOOLS.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
registry=${MIGRATE_TEST_REGISTRY:?run test/services.sh up first}
kubectl=${KUBECTL:?set KUBECTL to a kubectl binary}
tools=${RELEASE_TOOLS:-$root/bin/tools}
GORELEASER_VERSION=v2.15.1
KREW_VERSION=v0.4.3
tag=v0.0.0-releasecheck

mkdir -p "$tools"
tools=$(cd "$tools" && pwd)
install_tool() { # name module@version
  if [ ! -x "$tools/$1" ] || [ "$(cat "$tools/$1.version" 2>/dev/null)" != "$2" ]; then
    echo "release-check: installing $2"
    GOBIN=$tools go install "$2"
    echo "$2" > "$tools/$1.version"
  fi
}
install_tool goreleaser github.com/goreleaser/goreleaser/v2@$GORELEASER_VERSION
install_tool krew sigs.k8s.io/krew/cmd/krew@$KREW_VERSION
install_tool validate-krew-manifest sigs.k8s.io/krew/cmd/validate-krew-manifest@$KREW_VERSION
ln -sf "$tools/krew" "$tools/kubectl-krew"

# The release is built from a clone of HEAD, so a manifest regenerated from
# an uncommitted .goreleaser.yaml would silently keep the old text.
if [ -n "${KREW_MANIFEST_OUT:-}" ] && ! git -C "$root" diff --quiet HEAD -- .goreleaser.yaml; then
  echo "release-check: .goreleaser.yaml has uncommitted changes; commit them first, the release is built from a clone of HEAD" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$root" "$work/src"
cd "$work/src"
git tag "$tag"
commit=$(git rev-parse --short HEAD)

"$tools/goreleaser" check

# Point the images at the loopback registry and disable the GitHub release.
sed -i -e "s|^\(    base_image:\).*|\1 $registry/release-check/base:latest|" \
       -e "/^    repositories:/s|ghcr.io/kubectl-migrate/|$registry/release-check/|" \
       -e 's|^release:$|release:\n  disable: true|' .goreleaser.yaml
go run ./test/release base "$registry/release-check/base:latest"
GITHUB_TOKEN=offline-release-check "$tools/goreleaser" release --clean --skip=validate,announce --parallelism 2

version=${tag#v}
for os in linux darwin windows; do
  for arch in amd64 arm64; do
    archive=dist/kubectl-migrate_${version}_${os}_${arch}.tar.gz
    tar -tzf "$archive" | sort | tr '\n' ' ' | grep -q "LICENSE README.md kubectl-migrate" || { echo "release-check: $archive lacks files" >&2; exit 1; }
    grep -q "  kubectl-migrate_${version}_${os}_${arch}.tar.gz$" dist/checksums.txt
  done
done
echo "release-check: six archives with LICENSE, README and completion script; checksums listed"
for image in kubectl-migrate-agent ms2m-consumer ms2m-producer inventory; do
  go run ./test/release image "$registry/release-check/$image:$version" "$image"
done

manifest=dist/krew/migrate.yaml
"$tools/validate-krew-manifest" -manifest "$manifest" -skip-install
# Everything but the per-release lines must match the committed manifest.
strip() { grep -vE '^\s*(version|uri|sha256):' "$1"; }
if [ -n "${KREW_MANIFEST_OUT:-}" ]; then
  cp "$manifest" "$KREW_MANIFEST_OUT"
elif ! diff <(strip "$root/krew/migrate.yaml") <(strip "$manifest"); then
  echo "release-check: krew/migrate.yaml is out of date with .goreleaser.yaml; regenerate it with make krew-manifest" >&2
  exit 1
fi

export KREW_ROOT=$work/krew KREW_NO_UPGRADE_CHECK=1
export PATH=$KREW_ROOT/bin:$tools:$PATH
platform=$(go env GOOS)_$(go env GOARCH)
"$kubectl" krew install --manifest="$manifest" --archive="dist/kubectl-migrate_${version}_${platform}.tar.gz"
out=$("$kubectl" migrate version)
echo "$out"
[[ $out == "kubectl-migrate $version (commit $commit, built "* ]] || { echo "release-check: unexpected version output" >&2; exit 1; }

# Completion through kubectl: the script from the plugin's directory on PATH.
ln -s "$KREW_ROOT/store/migrate/$tag/kubectl_complete-migrate" "$KREW_ROOT/bin/"
# Captured first: grep -q stops reading at its match, and kubectl, still
# writing, would die of SIGPIPE and fail the pipeline (pipefail).
commands=$("$kubectl" __complete migrate "")
grep -q "^sts" <<<"$commands" || { echo "release-check: kubectl does not complete kubectl migrate: $commands" >&2; exit 1; }
modes=$("$kubectl" __complete migrate sts consumer-0 --mode "")
grep -q "^shadow" <<<"$modes" || { echo "release-check: flag values are not completed: $modes" >&2; exit 1; }
echo "release-check: installed with krew; version and completion work through kubectl"
