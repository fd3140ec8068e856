#!/usr/bin/env bash
# Prints the path of a current iasl (Debian trixie's acpica-tools, which knows the VIOT table),
# run through trixie's own glibc loader so that it works on older Debian releases too.
# Downloads both packages once into the cache.
set -euo pipefail
cache="${DRIVERLAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/driverlab}/iasl"
wrapper="$cache/iasl"
if [ -x "$wrapper" ] && "$wrapper" -v >/dev/null 2>&1; then
    echo "$wrapper"
    exit 0
fi
mirror=http://deb.debian.org/debian
mkdir -p "$cache"
curl -fsS -o "$cache/Packages.xz" "$mirror/dists/trixie/main/binary-amd64/Packages.xz"
filename() { xz -dc "$cache/Packages.xz" | awk -v p="Package: $1" '$0 == p {found=1} found && !done && /^Filename:/ {print $2; done=1}'; }
for pkg in acpica-tools libc6; do
    file=$(filename "$pkg")
    [ -n "$file" ] || { echo "no $pkg in Debian trixie's package list" >&2; exit 1; }
    curl -fsS -o "$cache/$pkg.deb" "$mirror/$file"
    rm -rf "${cache:?}/${pkg:?}" && mkdir -p "$cache/$pkg"
    dpkg-deb -x "$cache/$pkg.deb" "$cache/$pkg"
    rm -f "$cache/$pkg.deb"
done
rm -f "$cache/Packages.xz"
cat > "$wrapper" <<WRAPPER
#!/bin/sh
exec "$cache/libc6/usr/lib64/ld-linux-x86-64.so.2" --library-path "$cache/libc6/usr/lib/x86_64-linux-gnu" "$cache/acpica-tools/usr/bin/iasl" "\$@"
WRAPPER
chmod +x "$wrapper"
"$wrapper" -v >/dev/null
echo "$wrapper"
