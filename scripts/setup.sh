#!/usr/bin/env bash
# Installs what driverlab needs on a Debian machine, builds it, and runs the main job on its
# embedded default: the probe guest in a fresh micro-VM, driving the AQC100 model (served over
# vfio-user with its frame generator) behind the virtio-iommu, receiving 20000 frames with the
# stock driver's RX buffer strategy while every IOMMU map is counted.
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

driverlab=./target/release/driverlab
work=$(mktemp -d)
model_pid=""
cleanup() {
    if [ -n "$model_pid" ]; then kill "$model_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
"$driverlab" model aqc100 --once --generate size=1514 --socket "$work/aqc100.sock" 2>/dev/null &
model_pid=$!
for _ in $(seq 100); do [ -S "$work/aqc100.sock" ] && break; sleep 0.05; done
"$driverlab" vm run --kernel probe --iommu --device "vfio-user=$work/aqc100.sock" \
    --cmdline "probe.nic=aqc100 probe.rx=flip probe.frames=20000"
