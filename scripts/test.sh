#!/usr/bin/env bash
# Installs what the tests need, fetches the test kernel, and runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

apt_install build-essential curl ca-certificates xz-utils busybox-static python3 python3-pip python3-venv \
    patch dwarves libelf1 libssl3 zlib1g shellcheck iperf3 sockperf xdp-tools ethtool iproute2 linux-source-6.12 chromium jq \
    socat iputils-ping python3-yaml dash \
    openssh-client openssh-server e2fsprogs kmod procps
ensure_rust
# kcidb-io (PyPI) carries the KCIDB schema the KCIDB export is checked against.
python3 -c 'import kcidb_io' 2>/dev/null || python3 -m pip install --quiet kcidb-io >&2 \
    || python3 -m pip install --quiet --break-system-packages kcidb-io >&2 \
    || echo "kcidb-io could not be installed: the KCIDB schema test will skip" >&2
# schemathesis (PyPI) fuzzes a live daemon against its OpenAPI document (tests/api.rs).
DRIVERLAB_SCHEMATHESIS="$(scripts/fetch-schemathesis.sh)" || {
    echo "schemathesis could not be installed: the API fuzz test will skip" >&2
    DRIVERLAB_SCHEMATHESIS=""
}
export DRIVERLAB_SCHEMATHESIS
DRIVERLAB_IASL="$(scripts/fetch-iasl.sh)"
DRIVERLAB_ATLANTIC_SOURCE="$(scripts/fetch-atlantic-source.sh)"
DRIVERLAB_LAN743X_SOURCE="$(dirname "$(dirname "$DRIVERLAB_ATLANTIC_SOURCE")")/microchip"
export DRIVERLAB_IASL DRIVERLAB_ATLANTIC_SOURCE DRIVERLAB_LAN743X_SOURCE
# The release binary: the nested box carries it (and runs it under TCG, where a debug build's
# cost shows).
cargo build --release --locked
DRIVERLAB_RELEASE_BIN="$PWD/target/release/driverlab"
export DRIVERLAB_RELEASE_BIN
# The test kernel: the newest Debian 6.12 kernel, put into the image store as the lab's
# `kernel = "debian"` images get it (`driverlab image kernel`; before the tests, so that no test's
# request waits for the download). The tests boot its bzImage and take modules from its tree; the
# image tests build driver variants against its headers, which the image keeps (installing
# Debian's linux-headers package would pull a host kernel in through its dependencies).
kernel=$("$DRIVERLAB_RELEASE_BIN" image kernel)
manifest=$("$DRIVERLAB_RELEASE_BIN" image show "$kernel")
kernel_dir=$("$DRIVERLAB_RELEASE_BIN" image path "$kernel")
DRIVERLAB_TEST_BZIMAGE="$kernel_dir/$(jq -r .bzimage <<<"$manifest")"
DRIVERLAB_TEST_MODULES="$kernel_dir/$(jq -r .modules <<<"$manifest")"
export DRIVERLAB_IMAGE_TESTS=1 DRIVERLAB_TEST_BZIMAGE DRIVERLAB_TEST_MODULES
# The Linux check (tests/atlantic_linux.rs) and the nested box (tests/nested_box.rs) need root
# and QEMU 11.1 from a forky chroot (about 75 s and 410 MB the first time, cached after).
if [ "$(id -u)" -eq 0 ]; then
    "$DRIVERLAB_RELEASE_BIN" engine setup qemu >/dev/null
    export DRIVERLAB_LINUX_CHECK=1 DRIVERLAB_NESTED_BOX=1
else
    echo "not root: the Linux check (stock atlantic under QEMU against the model) and the nested box will skip" >&2
fi
# Every test's output is shown (--show-output) so that the skips, which tests print as
# `SKIP name: reason`, can be counted and listed at the end: a green run that skipped shows it.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --locked --no-fail-fast -- --show-output 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
summary=0
scripts/test-summary.sh "$log" || summary=$?
[ "$status" -ne 0 ] && exit "$status"
exit "$summary"
