#!/usr/bin/env bash
# Builds the Quotient image (quotient-coordinator, quotient-agent and quotient, as
# deploy/image/Dockerfile makes it) without a registry: stripped copies of binaries built
# here, the Debian packages of the libraries they link (found with ldd and dpkg -S) and
# busybox-static for /bin/sh, unpacked with dpkg-deb into a root filesystem that
# `docker import` turns into the image. Nothing is pulled from a registry; the .deb files
# come from this host's apt sources (`apt-get download`) and are cached.
#
#   bash deploy/image/build-offline.sh [--bin-dir DIR] [--tag IMAGE] [--force]
#
#   --bin-dir DIR   where the three binaries are [default: target/release of this checkout]
#   --tag IMAGE     the image's name [default: quotient:dev]
#   --force         build even when IMAGE already holds exactly these binaries
#
# Idempotent: the image records a digest of what went into it (label
# io.quotient.image.inputs); when IMAGE already has that digest nothing is done. The
# binaries must be built for this host's architecture and glibc (this host's Debian release
# provides the libraries). Tools missing here (dpkg-deb, strip, ldd) are installed with
# apt-get when run as root. QUOTIENT_IMAGE_DEB_CACHE sets the .deb cache
# [default: the bin dir's parent/quotient-image-debs, e.g. target/quotient-image-debs].
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin_dir="$root/target/release"
tag="quotient:dev"
force=0
BINARIES=(quotient-coordinator quotient-agent quotient)
QUOTIENT_UID=10001

die() {
    echo "build-offline: $*" >&2
    exit 1
}
say() { echo "build-offline: $*"; }

while [ "$#" -gt 0 ]; do
    case "$1" in
        --bin-dir) [ "$#" -ge 2 ] || die "--bin-dir needs a directory"; bin_dir="$2"; shift 2 ;;
        --bin-dir=*) bin_dir="${1#*=}"; shift ;;
        --tag) [ "$#" -ge 2 ] || die "--tag needs an image name"; tag="$2"; shift 2 ;;
        --tag=*) tag="${1#*=}"; shift ;;
        --force) force=1; shift ;;
        -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

# --- what is needed here
command -v docker >/dev/null 2>&1 || die "the docker CLI is not installed"
docker info >/dev/null 2>&1 || die "the Docker daemon is not reachable (docker info fails)"
[ -d "$bin_dir" ] || die "no directory $bin_dir: build first (cargo build --release), or pass --bin-dir"
bin_dir="$(cd "$bin_dir" && pwd)"
for binary in "${BINARIES[@]}"; do
    [ -x "$bin_dir/$binary" ] || die "$bin_dir/$binary is missing: build the workspace's binaries first (cargo build --release --bins), or pass --bin-dir"
done

missing=()
command -v dpkg-deb >/dev/null 2>&1 || missing+=(dpkg)
command -v strip >/dev/null 2>&1 || missing+=(binutils)
command -v ldd >/dev/null 2>&1 || missing+=(libc-bin)
command -v apt-get >/dev/null 2>&1 || die "apt-get is missing: this script needs a Debian or Ubuntu host"
if [ "${#missing[@]}" -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || die "missing tools; install the packages ${missing[*]} (as root: apt-get install ${missing[*]})"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- the inputs' digest: the binaries and these scripts
inputs_digest() {
    {
        for binary in "${BINARIES[@]}"; do sha256sum "$bin_dir/$binary" | cut -d' ' -f1; done
        cat "$here/build-offline.sh" "$here/entrypoint.sh" "$here/healthcheck.sh"
    } | sha256sum | cut -d' ' -f1
}
digest="$(inputs_digest)"
if [ "$force" -eq 0 ]; then
    existing="$(docker image inspect --format '{{ index .Config.Labels "io.quotient.image.inputs" }}' "$tag" 2>/dev/null || true)"
    if [ "$existing" = "$digest" ]; then
        say "$tag is up to date (inputs $digest)"
        exit 0
    fi
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs"

# --- the Debian packages: the libraries the binaries link, and busybox-static
packages=(busybox-static)
libraries=()
for binary in "${BINARIES[@]}"; do
    while read -r library; do
        [ -n "$library" ] || continue
        case "$library" in *"not found"*) die "$binary needs a library this host lacks: $library" ;; esac
        owner="$(dpkg -S "$library" 2>/dev/null || dpkg -S "$(readlink -f "$library")" 2>/dev/null || true)"
        [ -n "$owner" ] || die "no Debian package of this host holds $library (needed by $binary)"
        packages+=("${owner%%:*}")
        libraries+=("$library")
    done < <(LC_ALL=C ldd "$bin_dir/$binary" 2>/dev/null |
        sed -n -e 's/^[[:space:]]*\(.* => not found\).*/\1/p' -e 's/^[[:space:]]*\(.* => \)\{0,1\}\(\/[^ ]*\) (0x.*$/\2/p')
done
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sed 's/:.*//' | sort -u)
say "packages: ${packages[*]}"

cache="${QUOTIENT_IMAGE_DEB_CACHE:-$(dirname "$bin_dir")/quotient-image-debs}"
mkdir -p "$cache"
# The version apt would install of each package, and its file in the cache: apt-get download
# names it PACKAGE_VERSION_ARCH.deb with the epoch's colon as %3a.
candidate() { apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: //p'; }
cached_deb() { ls "$cache/${1}_${2//:/%3a}_"*.deb 2>/dev/null | head -n1; }
declare -A versions=()
# Fills `versions` and fetches what the cache lacks; fails (status 1) when apt knows no
# version of a package or the download fails, with why in $work/apt.log.
fetch_packages() {
    local package version fetch=()
    for package in "${packages[@]}"; do
        version="$(candidate "$package")"
        if [ -z "$version" ] || [ "$version" = "(none)" ]; then
            echo "apt knows no version of $package" >"$work/apt.log"
            return 1
        fi
        versions[$package]="$version"
        [ -n "$(cached_deb "$package" "$version")" ] || fetch+=("$package=$version")
    done
    [ "${#fetch[@]}" -gt 0 ] || return 0
    say "downloading ${fetch[*]} into $cache"
    (cd "$cache" && apt-get download -q "${fetch[@]}" >/dev/null 2>"$work/apt.log")
}
# Without the packages (no network to the Debian mirror): exactly the files ldd lists, and
# this host's busybox-static, copied from this host.
copy_from_host() {
    local busybox library
    busybox="$(command -v busybox || true)"
    [ -n "$busybox" ] && ! LC_ALL=C ldd "$busybox" >/dev/null 2>&1 ||
        die "cannot get ${packages[*]} ($(head -n1 "$work/apt.log")), and this host has no static busybox to copy instead: install busybox-static, or give apt a reachable Debian source"
    say "WARNING: cannot get ${packages[*]} ($(head -n1 "$work/apt.log")); copying the libraries ldd lists and $busybox from this host instead"
    mkdir -p "$rootfs/bin"
    cp "$busybox" "$rootfs/bin/busybox"
    for library in "${libraries[@]}"; do
        mkdir -p "$rootfs$(dirname "$library")"
        cp -L "$library" "$rootfs$library"
    done
}
# Stale or missing apt lists: as root, apt-get update and once more.
if fetch_packages; then
    from_packages=1
elif [ "$(id -u)" -eq 0 ]; then
    say "$(head -n1 "$work/apt.log"); running apt-get update and trying again"
    if apt-get update -qq >>"$work/apt.log" 2>&1 && fetch_packages; then
        from_packages=1
    else
        from_packages=0
    fi
else
    from_packages=0
fi
if [ "$from_packages" -eq 1 ]; then
    for package in "${packages[@]}"; do
        deb="$(cached_deb "$package" "${versions[$package]}")"
        [ -n "$deb" ] || die "no .deb of $package ${versions[$package]} in $cache after apt-get download"
        dpkg-deb -x "$deb" "$rootfs"
    done
else
    copy_from_host
fi
rm -rf "$rootfs/usr/share/doc" "$rootfs/usr/share/man" "$rootfs/usr/share/locale" \
    "$rootfs/usr/share/lintian" "$rootfs/usr/share/info"

# --- busybox's applets, the binaries, the scripts, the users and the directories
mkdir -p "$rootfs/bin" "$rootfs/usr/bin" "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/tmp" \
    "$rootfs/proc" "$rootfs/sys" "$rootfs/dev" "$rootfs/run"
chmod 1777 "$rootfs/tmp"
[ -x "$rootfs/bin/busybox" ] || die "busybox-static did not provide /bin/busybox"
for applet in $("$rootfs/bin/busybox" --list); do
    [ -e "$rootfs/bin/$applet" ] || [ -e "$rootfs/usr/bin/$applet" ] || ln -s busybox "$rootfs/bin/$applet"
done
for binary in "${BINARIES[@]}"; do
    strip --strip-debug -o "$rootfs/usr/local/bin/$binary" "$bin_dir/$binary"
done
install -m 0755 "$here/entrypoint.sh" "$rootfs/usr/local/bin/quotient-entrypoint"
install -m 0755 "$here/healthcheck.sh" "$rootfs/usr/local/bin/quotient-healthcheck"
cat >"$rootfs/etc/passwd" <<PASSWD
root:x:0:0:root:/root:/bin/sh
quotient:x:$QUOTIENT_UID:$QUOTIENT_UID:Quotient:/home/quotient:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat >"$rootfs/etc/group" <<GROUP
root:x:0:
quotient:x:$QUOTIENT_UID:
nogroup:x:65534:
GROUP
echo "hosts: files dns" >"$rootfs/etc/nsswitch.conf"
mkdir -p "$rootfs/root"
# The quotient user's directories, as the Dockerfile makes them (a named volume mounted on
# one of them starts with its owner).
owned=(home/quotient var/lib/quotient-coordinator var/lib/quotient-agent var/lib/quotient/checkpoints etc/quotient)
for dir in "${owned[@]}"; do mkdir -p "$rootfs/$dir"; done

# --- the image: root owns everything but the quotient user's directories (no root needed here)
layer="$work/rootfs.tar"
exclude=()
for dir in "${owned[@]}"; do exclude+=("--exclude=./$dir"); done
tar -C "$rootfs" --owner=root:0 --group=root:0 "${exclude[@]}" -cf "$layer" .
owned_paths=()
for dir in "${owned[@]}"; do owned_paths+=("./$dir"); done
tar -C "$rootfs" --owner="quotient:$QUOTIENT_UID" --group="quotient:$QUOTIENT_UID" -rf "$layer" "${owned_paths[@]}"

old="$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
docker import \
    --change 'ENTRYPOINT ["/usr/local/bin/quotient-entrypoint"]' \
    --change 'CMD ["--help"]' \
    --change "USER quotient" \
    --change 'WORKDIR /home/quotient' \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change "LABEL io.quotient.image.inputs=$digest" \
    --message "quotient image built offline by deploy/image/build-offline.sh from $bin_dir" \
    "$layer" "$tag" >/dev/null
new="$(docker image inspect --format '{{.Id}}' "$tag")"
# The image this tag named before is removed when nothing else uses it.
if [ -n "$old" ] && [ "$old" != "$new" ]; then
    docker image rm "$old" >/dev/null 2>&1 || true
fi
size="$(docker image inspect --format '{{.Size}}' "$tag")"
say "built $tag ($((size / 1024 / 1024)) MiB, inputs $digest)"
