#!/usr/bin/env bash
# Boot benchmark: installs QEMU (the reference), builds driverlab in release mode and prints
# boot-to-poweroff figures of the probe guest for both. Extra arguments go to `driverlab bench boot`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

apt_install qemu-system-x86
ensure_rust
cargo build --release --locked
./target/release/driverlab bench boot "$@"
