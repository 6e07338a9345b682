#!/usr/bin/env bash
# Builds the image the Docker runtime tests run, quotient-test-busybox:latest, offline:
# `docker import` of a root filesystem holding busybox-static (Debian's package) and its
# applets as symlinks. Nothing is pulled from a registry. Idempotent: an existing image is
# kept. Installs busybox-static with apt-get when missing (CI runs as root).
#
#   bash agent/tests/docker/build-test-image.sh
set -euo pipefail

IMAGE="${QUOTIENT_TEST_IMAGE:-quotient-test-busybox:latest}"

if ! command -v docker >/dev/null 2>&1; then
    echo "build-test-image: the docker CLI is not installed" >&2
    exit 1
fi
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "build-test-image: $IMAGE already exists"
    exit 0
fi

BUSYBOX=/bin/busybox
if ! dpkg -s busybox-static >/dev/null 2>&1; then
    echo "build-test-image: installing busybox-static"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq busybox-static >/dev/null
fi
# ldd fails on a static executable; a dynamic one would not run in the empty root filesystem.
if LC_ALL=C ldd "$BUSYBOX" >/dev/null 2>&1; then
    echo "build-test-image: $BUSYBOX is dynamically linked; busybox-static must provide it" >&2
    exit 1
fi

ROOTFS="$(mktemp -d)"
trap 'rm -rf "$ROOTFS"' EXIT
mkdir -p "$ROOTFS/bin" "$ROOTFS/tmp" "$ROOTFS/etc" "$ROOTFS/proc" "$ROOTFS/sys" "$ROOTFS/dev"
chmod 1777 "$ROOTFS/tmp"
cp "$BUSYBOX" "$ROOTFS/bin/busybox"
for applet in $("$BUSYBOX" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$ROOTFS/bin/$applet"
done
echo "root:x:0:0:root:/:/bin/sh" >"$ROOTFS/etc/passwd"
echo "root:x:0:" >"$ROOTFS/etc/group"

tar -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/bin' \
    --change 'CMD ["/bin/sh"]' \
    - "$IMAGE" >/dev/null
echo "build-test-image: built $IMAGE"
