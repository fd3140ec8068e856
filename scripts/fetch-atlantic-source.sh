#!/usr/bin/env bash
# Prints the path of the atlantic driver's source (drivers/net/ethernet/aquantia/atlantic of
# Debian's linux-source-6.12), installing the package and unpacking that folder, and the lan743x
# driver's (drivers/net/ethernet/microchip, next to it: ../../microchip), into the cache once.
# The AQC100 and LAN7430 models' register cross-checks read the drivers' definitions from there.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
series="${1:-6.12}"
cache="${DRIVERLAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/driverlab}/linux-source-$series"
dir="drivers/net/ethernet/aquantia/atlantic"
also="drivers/net/ethernet/microchip"

if [ ! -f "$cache/.complete-2" ]; then
    tarball="/usr/src/linux-source-$series.tar.xz"
    [ -f "$tarball" ] || apt_install "linux-source-$series"
    rm -rf "$cache"
    mkdir -p "$cache"
    echo "unpacking $dir from $tarball" >&2
    tar -xJf "$tarball" -C "$cache" --strip-components=1 "linux-source-$series/$dir" "linux-source-$series/$also"
    touch "$cache/.complete-2"
fi
echo "$cache/$dir"
