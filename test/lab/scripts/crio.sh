#!/usr/bin/env bash
# Builds CRI-O (and pinns) at a pinned module version inside the node rootfs,
# so it links against the rootfs' libseccomp/gpgme. Sources and modules are
# downloaded on the host; the build inside runs with GOPROXY=off.
# usage: crio.sh ROOTFS CACHE VERSION OUTDIR
set -euo pipefail
ROOTFS=$1 CACHE=$2 VERSION=$3 OUT=$4
export GOMODCACHE=$CACHE/gomod-crio GOFLAGS=-modcacherw
mkdir -p "$CACHE/build"
SRC=$CACHE/build/cri-o-$VERSION
if [ ! -d "$SRC" ]; then
  dir=$(go mod download -json "github.com/cri-o/cri-o@v$VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  rm -rf "$SRC.tmp"; cp -r "$dir" "$SRC.tmp"; chmod -R u+w "$SRC.tmp"
  (cd "$SRC.tmp" && go mod download)
  mv "$SRC.tmp" "$SRC"
fi
mnt() { mkdir -p "$ROOTFS$2"; mount --bind "$1" "$ROOTFS$2"; }
cleanup() { for m in /build /gomod /usr/local/go /proc; do umount "$ROOTFS$m" 2>/dev/null || true; done; }
trap cleanup EXIT
mnt "$SRC" /build; mnt "$GOMODCACHE" /gomod; mnt "$(go env GOROOT)" /usr/local/go
mount -t proc proc "$ROOTFS/proc"
chroot "$ROOTFS" env -i PATH=/usr/local/go/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  GOMODCACHE=/gomod GOCACHE=/build/.gocache GOFLAGS=-modcacherw GOPROXY=off GOTOOLCHAIN=local GOTELEMETRY=off \
  sh -ec "cd /build
    make -C pinns >/dev/null
    CGO_ENABLED=1 go build -trimpath -tags 'containers_image_openpgp containers_image_ostree_stub seccomp exclude_graphdriver_btrfs exclude_graphdriver_devicemapper' \
      -ldflags '-s -w -X github.com/cri-o/cri-o/internal/version.version=$VERSION' -o bin/crio ./cmd/crio"
mkdir -p "$OUT"
cp "$SRC/bin/crio" "$OUT/crio"
cp "$SRC/bin/pinns" "$OUT/pinns" 2>/dev/null || cp "$SRC/pinns/pinns" "$OUT/pinns" 2>/dev/null || cp "$SRC"/pinns/bin/pinns "$OUT/pinns"
