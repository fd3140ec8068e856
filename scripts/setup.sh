#!/usr/bin/env bash
# Installs what driverlab needs on a Debian machine, builds it, and runs the main job on its
# embedded default: the lab runs examples/probe-matrix.toml, the probe guest's three RX buffer
# strategies (flip as the baseline, order3, pool) against the AQC100 model behind the
# virtio-iommu, 5 repetitions each, and prints the report: IOMMU maps per packet and throughput,
# with verdicts against flip.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

apt_install build-essential curl ca-certificates
ensure_rust
cargo build --release --locked

if ! [ -r /dev/kvm ] || ! [ -w /dev/kvm ]; then
    echo "driverlab needs read/write access to /dev/kvm: add yourself to the kvm group" \
         "(sudo usermod -aG kvm \"$USER\", then log in again) or run as root" >&2
    exit 1
fi

./target/release/driverlab lab run examples/probe-matrix.toml
