#!/usr/bin/env bash
# Prints the path of Debian's linux-image-SERIES amd64 kernel (a bzImage), downloading and
# unpacking the package once into the cache. Usage: fetch-debian-kernel.sh [SERIES], default 6.12.
set -euo pipefail
series="${1:-6.12}"
cache="${DRIVERLAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/driverlab}/debian-kernel-$series"
find_kernel() { ls "$cache"/boot/vmlinuz-"$series".*-amd64 2>/dev/null | sort -V | tail -n 1; }

kernel=$(find_kernel || true)
if [ -z "$kernel" ]; then
    pattern="^linux-image-${series//./\\.}\\.[0-9]+\\+deb[0-9]+-amd64-unsigned\$"
    pkg=$(apt-cache search --names-only "$pattern" | awk '{print $1}' | sort -V | tail -n 1)
    if [ -z "$pkg" ]; then
        echo "no package matching $pattern in apt's lists (run apt-get update)" >&2
        exit 1
    fi
    mkdir -p "$cache"
    (cd "$cache" && apt-get download "$pkg" >&2)
    deb=$(ls "$cache"/"$pkg"_*.deb)
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$cache" ./boot
    rm -f "$deb"
    kernel=$(find_kernel)
fi
echo "$kernel"
