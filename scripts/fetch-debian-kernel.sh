#!/usr/bin/env bash
# Prints the path of Debian's linux-image-SERIES amd64 kernel (a bzImage), downloading and
# unpacking the package once into the cache. Usage: fetch-debian-kernel.sh [SERIES], default 6.12.
# With --modules it prints instead the module directory (lib/modules/VERSION, .ko.xz files as
# Debian ships them, without modules.dep) that belongs to the kernel the plain call prints.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

usage() {
    cat <<'EOF'
Usage: scripts/fetch-debian-kernel.sh [--modules] [SERIES]

Prints the path of the newest cached Debian linux-image-SERIES-amd64 kernel (default
SERIES 6.12), downloading linux-image-SERIES.N+debXX-amd64-unsigned with apt once.
  --modules  print the kernel's module directory (CACHE/lib/modules/VERSION) instead,
             fetching the package again if an older cache holds only the kernel
Cache: ${DRIVERLAB_CACHE:-~/.cache/driverlab}/debian-kernel-SERIES/{boot,lib/modules}
EOF
}

mode=kernel
series=6.12
while [ $# -gt 0 ]; do
    case "$1" in
        --modules) mode=modules ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
        *) series="$1" ;;
    esac
    shift
done
cache="${DRIVERLAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/driverlab}/debian-kernel-$series"
# shellcheck disable=SC2012  # Debian's vmlinuz-VERSION names have no odd characters
find_kernel() { ls "$cache"/boot/vmlinuz-"$series".*-amd64 2>/dev/null | sort -V | tail -n 1; }
kernel_version() { basename "$1" | sed 's/^vmlinuz-//'; }

# The newest unsigned generic image of the series that apt knows about.
newest_package() {
    local pattern pkg
    pattern="^linux-image-${series//./\\.}\\.[0-9]+\\+deb[0-9]+-amd64-unsigned\$"
    pkg=$(apt-cache search --names-only "$pattern" | awk '{print $1}' | sort -V | tail -n 1)
    if [ -z "$pkg" ]; then
        # A fresh machine may never have fetched its package lists.
        as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
        pkg=$(apt-cache search --names-only "$pattern" | awk '{print $1}' | sort -V | tail -n 1)
    fi
    if [ -z "$pkg" ]; then
        echo "no package matching $pattern in apt's lists: is bookworm-backports or" \
             "bookworm-security in /etc/apt/sources.list.d?" >&2
        exit 1
    fi
    echo "$pkg"
}

# Downloads one linux-image package and moves its kernel and modules into the cache. It unpacks
# into a scratch directory first and moves the module tree before the kernel, so that an
# interrupted run never leaves a kernel whose modules are half there.
fetch_package() {
    local pkg="$1" tmp deb kver
    tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
    # shellcheck disable=SC2064  # expand $tmp now: it is local to this function
    trap "rm -rf '$tmp'" EXIT
    (cd "$tmp" && apt-get download "$pkg" >&2)
    deb=$(ls "$tmp"/"$pkg"_*.deb)
    mkdir "$tmp/x"
    echo "unpacking $(basename "$deb")" >&2
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp/x" ./boot ./lib/modules
    mkdir -p "$cache/boot" "$cache/lib/modules"
    for dir in "$tmp"/x/lib/modules/*; do
        kver=$(basename "$dir")
        rm -rf "$cache/lib/modules/$kver"
        mv "$dir" "$cache/lib/modules/$kver"
    done
    mv -f "$tmp"/x/boot/* "$cache/boot/"
    rm -rf "$tmp"
    trap - EXIT
}

mkdir -p "$cache"
# The tests and the Linux check may both want the kernel at once; one download is enough.
exec 9>"$cache/.lock"
flock 9

kernel=$(find_kernel || true)
if [ -z "$kernel" ]; then
    fetch_package "$(newest_package)"
    kernel=$(find_kernel)
fi
if [ "$mode" = kernel ]; then
    echo "$kernel"
    exit 0
fi

kver=$(kernel_version "$kernel")
if [ ! -d "$cache/lib/modules/$kver" ]; then
    # A cache made before modules were kept: fetch the same version again, because modules only
    # load into the kernel they were built with. If the archive has dropped that version, fetch
    # the newest one, which then becomes the kernel the plain call prints.
    pkg="linux-image-$kver-unsigned"
    if apt-cache show "$pkg" >/dev/null 2>&1; then
        echo "the cache has kernel $kver without its modules; fetching $pkg" >&2
    else
        pkg=$(newest_package)
        newest=${pkg#linux-image-}
        newest=${newest%-unsigned}
        if [ "$(printf '%s\n' "$kver" "$newest" | sort -V | tail -n 1)" = "$kver" ]; then
            # The cache is newer than apt's lists (made with fresher lists, or copied here).
            echo "the cache has kernel $kver without its modules, and apt knows no" \
                "linux-image-$kver-unsigned: run apt-get update, or delete $cache to start over" >&2
            exit 1
        fi
        echo "$kver is no longer in apt's lists; fetching $pkg (kernel and modules)" >&2
    fi
    fetch_package "$pkg"
    kernel=$(find_kernel)
    kver=$(kernel_version "$kernel")
fi
if [ ! -d "$cache/lib/modules/$kver" ]; then
    echo "no modules for $kver in $cache/lib/modules; delete $cache and run again" >&2
    exit 1
fi
echo "$cache/lib/modules/$kver"
