#!/usr/bin/env bash
# Usage: scripts/ci-matrix.sh TEMPLATE > matrix.toml
# Builds, through the driverlab daemon on $DRIVERLAB_SOCKET, the images the seed experiments
# need (Debian's 6.12 kernel; atlantic with seed 000's rxpageorder patch and with seed 001's
# page_pool conversion; an initramfs for each and one with the stock driver), and prints
# TEMPLATE with their IDs in place of @KERNEL@, @INITRD_STOCK@, @INITRD_RXPAGEORDER@ and
# @INITRD_PAGE_POOL@. The same inputs give the same IDs, so a second call builds nothing.
set -euo pipefail
template=${1:?usage: scripts/ci-matrix.sh TEMPLATE}
socket=${DRIVERLAB_SOCKET:?set DRIVERLAB_SOCKET to the daemon socket}
cd "$(dirname "$0")/.."
api() {
    local out
    out=$(curl -s -w '\n%{http_code}' --unix-socket "$socket" -H 'content-type: application/json' "$@")
    local code=${out##*$'\n'}
    local body=${out%$'\n'*}
    if [ "${code:0:1}" != 2 ]; then
        echo "the daemon answered $code to $*: $body" >&2
        return 1
    fi
    printf '%s' "$body"
}
kernel=$(api -X POST http://x/v1/images/kernel | jq -r .id)
module() {
    jq -n --arg k "$kernel" --rawfile p "$1" '{kernel: $k, patches: [$p]}' |
        api -X POST http://x/v1/images/module -d @- | jq -r .id
}
initramfs() {
    jq -n --arg k "$kernel" --argjson m "$1" '{kernel: $k, modules: $m}' |
        api -X POST http://x/v1/images/initramfs -d @- | jq -r .id
}
rxpageorder=$(module examples/patches/000-atlantic-rxpageorder.patch)
page_pool=$(module examples/patches/001-atlantic-page-pool.patch)
stock_initrd=$(initramfs '[]')
rxpageorder_initrd=$(initramfs "[\"$rxpageorder\"]")
page_pool_initrd=$(initramfs "[\"$page_pool\"]")
echo "kernel $kernel; modules $rxpageorder (rxpageorder), $page_pool (page_pool)" >&2
sed -e "s/@KERNEL@/$kernel/" \
    -e "s/@INITRD_STOCK@/$stock_initrd/" \
    -e "s/@INITRD_RXPAGEORDER@/$rxpageorder_initrd/" \
    -e "s/@INITRD_PAGE_POOL@/$page_pool_initrd/" "$template"
