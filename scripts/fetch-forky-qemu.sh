#!/usr/bin/env bash
# Prints the path of a Debian forky chroot that holds QEMU 11.x (qemu-system-x86), creating it
# once with debootstrap. Bookworm's own QEMU (7.2) has no vfio-user client; forky's has one, and
# it runs fine from a chroot on a bookworm host. Progress goes to stderr, the path to stdout.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/fetch-forky-qemu.sh [--help]

Creates (once) a Debian forky minbase chroot with qemu-system-x86 in
  ${DRIVERLAB_CACHE:-~/.cache/driverlab}/forky-qemu
and prints its path. Run the emulator as `chroot PATH qemu-system-x86_64 ...`.

The chroot is only used once it is complete (marker file .driverlab-complete);
an interrupted run leaves a *.partial directory that the next run deletes and redoes.

Environment:
  DRIVERLAB_CACHE          cache directory (default ~/.cache/driverlab)
  DRIVERLAB_DEBIAN_MIRROR  Debian mirror URI (default: the one in this host's apt sources)
EOF
}
case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    "") ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."
. scripts/lib.sh

cache="${DRIVERLAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/driverlab}"
root="$cache/forky-qemu"
partial="$root.partial"
marker=".driverlab-complete"
# What the chroot must contain. Changing this list makes existing chroots stale (see below).
packages="qemu-system-x86"

# The host's Debian mirror: only Debian mirrors are reachable from the machines this project runs
# on, and the host's apt sources name one that works. deb822 first (bookworm's default), then the
# one-line format. The security archive has no forky suite, so only the main archive's entry counts.
host_mirror() {
    local uri=""
    if [ -r /etc/apt/sources.list.d/debian.sources ]; then
        uri=$(awk '
            /^[[:space:]]*$/ { if (deb && main && u != "") { print u; exit } deb = main = 0; u = ""; next }
            tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
            tolower($1) == "uris:" { u = $2 }
            tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i !~ /-security$/) main = 1 }
            END { if (deb && main && u != "") print u }
        ' /etc/apt/sources.list.d/debian.sources | head -n 1)
    fi
    if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
        # "deb [options] URI suite components": skip the optional [..] block.
        uri=$(sed -E -n 's/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+)[[:space:]]+[a-z]+[[:space:]].*/\2/p' \
            /etc/apt/sources.list | grep -v -- '-security' | head -n 1 || true)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

# Deleting a directory tree that still has something mounted below it (a crashed check's bind
# mount of /dev, say) would delete the host's files through the mount. Refuse instead.
assert_nothing_mounted_below() {
    local dir="$1"
    if awk -v d="$dir/" 'index($2 "/", d) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
        echo "refusing to delete $dir: something is mounted below it:" >&2
        awk -v d="$dir/" 'index($2 "/", d) == 1 { print "  " $2 }' /proc/self/mounts >&2
        echo "unmount those (umount -R PATH) and run again" >&2
        exit 1
    fi
}

mkdir -p "$cache"
# Two checks starting at once must not debootstrap into the same directory.
exec 9>"$cache/forky-qemu.lock"
flock 9

if [ -f "$root/$marker" ] && [ "$(cat "$root/$marker")" = "$packages" ]; then
    echo "$root"
    exit 0
fi
if [ -e "$root" ]; then
    # Complete but made for another package list, or from before the marker existed.
    echo "$root is stale or incomplete; recreating it" >&2
    assert_nothing_mounted_below "$root"
    as_root rm -rf "$root"
fi
if [ -e "$partial" ]; then
    echo "removing the remains of an interrupted run: $partial" >&2
    assert_nothing_mounted_below "$partial"
    as_root rm -rf "$partial"
fi

apt_install debootstrap
mirror="${DRIVERLAB_DEBIAN_MIRROR:-$(host_mirror)}"
# Bookworm's debootstrap has no script named forky; forky is a testing suite like sid, so sid's
# script fits (the keyring of bookworm verifies forky's Release file).
script=/usr/share/debootstrap/scripts/sid
echo "debootstrap forky ($packages) from $mirror into $partial (about 75 s and 410 MB)" >&2
start=$SECONDS
if ! as_root debootstrap --variant=minbase --include="${packages// /,}" \
        forky "$partial" "$mirror" "$script" >&2; then
    echo "debootstrap failed; see $partial/debootstrap/debootstrap.log," \
        "check that $mirror is reachable (or set DRIVERLAB_DEBIAN_MIRROR), then run again" >&2
    exit 1
fi

# Fail now, not in the middle of a check, if this QEMU lacks what the check needs.
version=$(as_root chroot "$partial" qemu-system-x86_64 --version | head -n 1)
for dev in vfio-user-pci virtio-iommu-pci e1000e; do
    if ! as_root chroot "$partial" qemu-system-x86_64 -device help | grep -q "\"$dev\""; then
        echo "the chroot's QEMU ($version) has no $dev device; is forky's qemu-system-x86 older than 11?" >&2
        exit 1
    fi
done
echo "$packages" | as_root tee "$partial/$marker" >/dev/null
as_root mv "$partial" "$root"
echo "forky chroot ready in $((SECONDS - start)) s: $version" >&2
echo "$root"
