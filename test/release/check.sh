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
#  4. krew's manifest validator, and krew/live-migrate.yaml in sync with the
#     generated manifest;
#  5. the README's kubectl krew install --manifest-url line, run against the
#     release's download layout served on loopback (the archives, checksums
#     and the release's extra files, the krew manifest among them) into a
#     temporary KREW_ROOT; then kubectl live-migrate version, help naming
#     the command as krew installed it, and shell completion through kubectl.
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
# Where GitHub serves a release's files; the check serves the same layout on
# loopback.
github_releases=https://github.com/kubectl-migrate/kubectl-migrate/releases/download

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
server_pid=
trap '[ -z "$server_pid" ] || kill "$server_pid"; rm -rf "$work"' EXIT
git clone -q "$root" "$work/src"
cd "$work/src"
git tag "$tag"
commit=$(git rev-parse --short HEAD)

"$tools/goreleaser" check

# The release's download layout on loopback, up before the release since
# the krew manifest's URLs name its address.
go build -o "$work/release" ./test/release
"$work/release" serve "$work/src/dist" "$work/addr" &
server_pid=$!
for _ in $(seq 100); do [ -s "$work/addr" ] && break; sleep 0.1; done
[ -s "$work/addr" ] || { echo "release-check: the release server did not start" >&2; exit 1; }
releases=http://$(cat "$work/addr")/kubectl-migrate/kubectl-migrate/releases/download

# Point the images at the loopback registry, the krew manifest's URLs at the
# loopback layout, and disable the GitHub release.
sed -i -e "s|^\(    base_image:\).*|\1 $registry/release-check/base:latest|" \
       -e "/^    repositories:/s|ghcr.io/kubectl-migrate/|$registry/release-check/|" \
       -e "/^    url_template:/s|$github_releases|$releases|" \
       -e 's|^release:$|release:\n  disable: true|' .goreleaser.yaml
"$work/release" base "$registry/release-check/base:latest"
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
  "$work/release" image "$registry/release-check/$image:$version" "$image"
done

manifest=dist/krew/live-migrate.yaml
"$tools/validate-krew-manifest" -manifest "$manifest" -skip-install
# Everything but the per-release lines must match the committed manifest.
strip() { grep -vE '^\s*(version|uri|sha256):' "$1"; }
if [ -n "${KREW_MANIFEST_OUT:-}" ]; then
  sed "s|$releases|$github_releases|" "$manifest" >"$KREW_MANIFEST_OUT"
elif ! diff <(strip "$root/krew/live-migrate.yaml") <(strip "$manifest"); then
  echo "release-check: krew/live-migrate.yaml is out of date with .goreleaser.yaml; regenerate it with make krew-manifest" >&2
  exit 1
fi

export KREW_ROOT=$work/krew KREW_NO_UPGRADE_CHECK=1
export PATH=$KREW_ROOT/bin:$tools:$PATH
# krew installs from a manifest URL only beside an index, which it updates
# first; a user's is GitHub's krew-index, out of reach here: an empty local
# one stands in.
git init -q "$work/index" && mkdir "$work/index/plugins" && touch "$work/index/plugins/.keep"
git -C "$work/index" add plugins && git -C "$work/index" -c user.name=check -c user.email=check@localhost commit -qm index
mkdir -p "$KREW_ROOT/index" && git clone -q "$work/index" "$KREW_ROOT/index/default"
# The README's install line, with the release's host and tag.
readme_line=$(grep -o 'kubectl krew install --manifest-url=[^ ]*' "$root/README.md" | head -1)
manifest_url=${readme_line#*--manifest-url=}
[[ $manifest_url == "$github_releases"/vX.Y.Z/* ]] || { echo "release-check: the README's krew line is not a release download: $readme_line" >&2; exit 1; }
manifest_url=$releases/$tag/${manifest_url##*/}
"$kubectl" krew install --manifest-url="$manifest_url"
out=$("$kubectl" live-migrate version)
echo "$out"
[[ $out == "kubectl-migrate $version (commit $commit, built "* ]] || { echo "release-check: unexpected version output" >&2; exit 1; }
help=$("$kubectl" live-migrate pod --help)
grep -q "^  kubectl live-migrate pod NAME --to NODE" <<<"$help" || { echo "release-check: help does not name the command krew installed: $help" >&2; exit 1; }

# Completion through kubectl: the script from the plugin's directory on PATH,
# linked under krew's name.
ln -s "$KREW_ROOT/store/live-migrate/$tag/kubectl_complete-migrate" "$KREW_ROOT/bin/kubectl_complete-live_migrate"
# Captured first: grep -q stops reading at its match, and kubectl, still
# writing, would die of SIGPIPE and fail the pipeline (pipefail).
commands=$("$kubectl" __complete live-migrate "")
grep -q "^sts" <<<"$commands" || { echo "release-check: kubectl does not complete kubectl live-migrate: $commands" >&2; exit 1; }
modes=$("$kubectl" __complete live-migrate sts consumer-0 --mode "")
grep -q "^shadow" <<<"$modes" || { echo "release-check: flag values are not completed: $modes" >&2; exit 1; }
echo "release-check: installed with krew from the release's manifest URL; version, help and completion work through kubectl"
