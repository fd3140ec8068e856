#!/usr/bin/env bash
# Installs what driverlab needs on a Debian machine, builds it, and runs the main job on its
# embedded default: the probe guest in a fresh micro-VM.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

apt_install build-essential curl ca-certificates
ensure_rust
cargo build --release

if ! [ -r /dev/kvm ] || ! [ -w /dev/kvm ]; then
    echo "driverlab needs read/write access to /dev/kvm: add yourself to the kvm group" \
         "(sudo usermod -aG kvm \"$USER\", then log in again) or run as root" >&2
    exit 1
fi
./target/release/driverlab vm run --kernel probe --memory 256 --vcpus 2 --cmdline "probe.echo=1"
