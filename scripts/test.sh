#!/usr/bin/env bash
# Installs what the tests need, fetches the test kernel, and runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

apt_install build-essential curl ca-certificates busybox-static
ensure_rust
DRIVERLAB_TEST_BZIMAGE="$(scripts/fetch-debian-kernel.sh 6.12)"
export DRIVERLAB_TEST_BZIMAGE
cargo test --workspace --locked
