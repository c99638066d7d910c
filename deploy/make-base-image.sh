#!/usr/bin/env bash
# Makes the root file system of `debian:bookworm-slim` as a tarball, for
# machines that reach Debian's package mirror but no image registry (this
# project's CI machines). `test-compose.sh` imports it into the docker engine
# it starts, under the name the Dockerfiles use.
#
# Usage: deploy/make-base-image.sh [OUT.tar]   (default: target/deploy/bookworm-minbase.tar)
# Needs root and debootstrap (installed when missing). The mirror is read at
# run time from this machine's apt sources; nothing is hard-coded.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/deploy/bookworm-minbase.tar}"
if [ -s "$out" ]; then
    echo "make-base-image: $out exists; keeping it"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "make-base-image: needs root (debootstrap)" >&2
    exit 1
fi
if ! command -v debootstrap >/dev/null; then
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null
fi
# The first Debian mirror of the apt sources, deb822 (`URIs:`) or one-line
# (`deb URL suite ...`) style.
mirror=$(
    { cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } \
        | awk '/^URIs:/ { print $2 } /^deb / { print ($2 ~ /^\[/ ? $3 : $2) }' \
        | { grep -E '/debian/?$' || true; } | head -n 1
)
if [ -z "$mirror" ]; then
    echo "make-base-image: no Debian mirror found in /etc/apt/sources.list{,.d}" >&2
    exit 1
fi
mkdir -p "$(dirname "$out")"
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
echo "make-base-image: debootstrap --variant=minbase bookworm from $mirror"
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
    tail -n 30 "$rootfs.log" >&2
    exit 1
}
rm -f "$rootfs.log"
# Image hygiene, like the official slim image: no apt lists, no caches.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
tar -C "$rootfs" -cf "$out.tmp" .
mv "$out.tmp" "$out"
echo "make-base-image: wrote $out ($(du -h "$out" | cut -f1))"
