#!/usr/bin/env bash
# Builds the base layer of the lab's Debian images: trixie (minbase) with
# python3 and pika, and redis-server (software no one here wrote, to move), all
# from Debian, without docs, caches or apt state, as a
# gzipped tar (the registry gets it as is).
# usage: python-rootfs.sh DEST.tar.gz   (builds in DEST.tmp, then renames)
set -euo pipefail
DEST=$1
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TMP=$DEST.tmp
command -v debootstrap >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
rm -rf "$TMP" "$TMP.dir"
debootstrap --variant=minbase --include=python3-minimal,python3-pika,redis-server trixie "$TMP.dir" "$MIRROR" >"$TMP.log" 2>&1 || { tail -20 "$TMP.log"; exit 1; }
chroot "$TMP.dir" /usr/bin/python3 -c 'import pika'
chroot "$TMP.dir" /usr/bin/redis-server --version
rm -rf "$TMP.dir"/usr/share/{doc,man,info,locale} "$TMP.dir"/var/cache/apt/* "$TMP.dir"/var/lib/apt/lists/* "$TMP.dir"/var/log/*
tar --numeric-owner -C "$TMP.dir" -czf "$TMP" .
rm -rf "$TMP.dir" "$TMP.log"
mv "$TMP" "$DEST"
