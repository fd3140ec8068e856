#!/usr/bin/env bash
# Installs what the tests need, fetches the test kernel, and runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

apt_install build-essential curl ca-certificates xz-utils busybox-static
ensure_rust
DRIVERLAB_TEST_BZIMAGE="$(scripts/fetch-debian-kernel.sh 6.12)"
DRIVERLAB_IASL="$(scripts/fetch-iasl.sh)"
DRIVERLAB_ATLANTIC_SOURCE="$(scripts/fetch-atlantic-source.sh)"
export DRIVERLAB_TEST_BZIMAGE DRIVERLAB_IASL DRIVERLAB_ATLANTIC_SOURCE
cargo test --workspace --locked
