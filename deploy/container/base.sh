#!/usr/bin/env bash
# Makes the Debian 12 base image the Containerfile builds FROM where no
# registry can be reached: `debootstrap --variant=minbase bookworm` into a
# root filesystem (cached as a tarball in .cache/container/, ignored by git),
# then `podman import` as localhost/loom-base:bookworm. The mirror is the
# one apt on this machine uses (/etc/apt/sources*), so no host is named here.
#
#   deploy/container/base.sh          # build the cache if missing, import if missing
#   deploy/container/base.sh --check  # exit 0 when the cache exists (tests ask this)
#
# Podman's settings for this kind of VM (crun cannot run with hybrid cgroups
# here) are in deploy/container/containers.conf; this script exports
# CONTAINERS_CONF pointing at it.
set -eu
cd "$(dirname "$0")/../.."
cache=.cache/container
tar=$cache/bookworm-minbase.tar
[ "${1:-}" = --check ] && { [ -s "$tar" ]; exit; }
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/container/containers.conf}
mirror() {
    local m
    m=$(grep -rhoE '^URIs: *[^ ]+/debian/?$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | sed 's/^URIs: *//')
    [ -n "$m" ] || m=$(grep -rhoE '^deb +[^ ]+/debian/? +bookworm' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -1 | awk '{print $2}')
    [ -n "$m" ] || { echo "base.sh: no Debian mirror in /etc/apt/sources*: give one as MIRROR=..." >&2; exit 1; }
    echo "$m"
}
if [ ! -s "$tar" ]; then
    command -v debootstrap > /dev/null || { echo "base.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
    mkdir -p "$cache"
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    echo "base.sh: debootstrap --variant=minbase bookworm (about half a minute)"
    debootstrap --variant=minbase bookworm "$root" "${MIRROR:-$(mirror)}" > "$cache/debootstrap.log" 2>&1 \
        || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
    # apt inside the image uses the same mirror as the build machine.
    tar -C "$root" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
fi
if ! podman image exists localhost/loom-base:bookworm; then
    podman import --quiet "$tar" localhost/loom-base:bookworm > /dev/null
fi
echo "base.sh: localhost/loom-base:bookworm ready (from $tar)"
