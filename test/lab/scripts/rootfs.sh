#!/usr/bin/env bash
# Builds the node root filesystem: Debian trixie (minbase) with runc, conmon,
# CNI plugins, iptables and CRIU ≥ 4.2 + libcriu from sid (trixie's CRIU 4.1
# cannot dump INET sockets on kernels ≥ 6.16), plus what building CRI-O needs.
# usage: rootfs.sh DEST   (builds DEST.tmp, then renames it to DEST)
set -euo pipefail
DEST=$1
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TMP=$DEST.tmp
command -v debootstrap >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
rm -rf "$TMP"
debootstrap --variant=minbase --include=ca-certificates trixie "$TMP" "$MIRROR" >"$TMP.log" 2>&1 || { tail -20 "$TMP.log"; exit 1; }
cat > "$TMP/etc/apt/sources.list" <<SRC
deb $MIRROR trixie main
deb $MIRROR sid main
deb $MIRROR experimental main
SRC
# The machine clock can make sid's Release files look expired.
echo 'Acquire::Check-Valid-Until "false";' > "$TMP/etc/apt/apt.conf.d/99lab"
cat > "$TMP/etc/apt/preferences.d/pin" <<'PIN'
Package: *
Pin: release n=trixie
Pin-Priority: 900

Package: *
Pin: release a=unstable
Pin-Priority: 100

Package: *
Pin: release a=experimental
Pin-Priority: 50
PIN
in_root() { chroot "$TMP" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "$@"; }
mount -t proc proc "$TMP/proc"
trap 'umount "$TMP/proc" 2>/dev/null || true' EXIT
in_root apt-get update -qq
in_root apt-get install -y -qq --no-install-recommends runc conmon containernetworking-plugins iptables nftables iproute2 \
  gcc libc6-dev make pkg-config libseccomp-dev libgpgme-dev >/dev/null
in_root apt-get install -y -qq --no-install-recommends -t sid criu libcriu2 >/dev/null
in_root criu --version
in_root apt-get clean
umount "$TMP/proc"; trap - EXIT
mv "$TMP" "$DEST"
