#!/usr/bin/env bash
# Usage: scripts/ci-matrix.sh TEMPLATE > matrix.toml
# Builds the images the seed experiments need (Debian's 6.12 kernel; atlantic with seed 000's
# rxpageorder patch and with seed 001's page_pool conversion; an initramfs for each and one with
# the stock driver), and prints TEMPLATE with their IDs in place of @KERNEL@, @INITRD_STOCK@,
# @INITRD_RXPAGEORDER@ and @INITRD_PAGE_POOL@. The same inputs give the same IDs, so a second
# call builds nothing.
#
# Where the images are built:
#   through the box's daemon (a lab box builds its own images): on $DRIVERLAB_SOCKET, or over TCP
#     at $DRIVERLAB_URL with the bearer token in $DRIVERLAB_TOKEN_FILE;
#   here, with DRIVERLAB_BUILD_HERE=1: by this host's driverlab ($DRIVERLAB, default
#     target/release/driverlab) into this host's image store, for a daemon that reads that store
#     (the nested box).
set -euo pipefail
template=${1:?usage: scripts/ci-matrix.sh TEMPLATE}
cd "$(dirname "$0")/.."

if [ "${DRIVERLAB_BUILD_HERE:-}" = 1 ]; then
    driverlab=${DRIVERLAB:-target/release/driverlab}
    # Each `driverlab image` command's last line is its image's ID (the initramfs: its path).
    last() { "$driverlab" image "$@" | tail -n 1; }
    kernel=$(last kernel)
    module() { last module --kernel "$kernel" --patch "$1" | sed -n 's/.*\(module-[0-9a-f]*\).*/\1/p'; }
    initramfs() {
        local args=()
        for m in "$@"; do args+=(--module "$m"); done
        last initramfs --kernel "$kernel" "${args[@]}" | sed -n 's/.*\(initramfs-[0-9a-f]*\).*/\1/p'
    }
else
    if [ -n "${DRIVERLAB_URL:-}" ]; then
        token=$(head -n 1 "${DRIVERLAB_TOKEN_FILE:?set DRIVERLAB_TOKEN_FILE with DRIVERLAB_URL}")
        transport=(-H "authorization: Bearer $token")
        base=${DRIVERLAB_URL%/}
    else
        transport=(--unix-socket "${DRIVERLAB_SOCKET:?set DRIVERLAB_SOCKET (or DRIVERLAB_URL) to the daemon}")
        base=http://x
    fi
    api() {
        local path=$1 out
        shift
        out=$(curl -s -w '\n%{http_code}' "${transport[@]}" -H 'content-type: application/json' "$@" "$base$path")
        local code=${out##*$'\n'}
        local body=${out%$'\n'*}
        if [ "${code:0:1}" != 2 ]; then
            echo "the daemon answered $code to $path: $body" >&2
            return 1
        fi
        printf '%s' "$body"
    }
    kernel=$(api /v1/images/kernel -X POST | jq -r .id)
    module() {
        jq -n --arg k "$kernel" --rawfile p "$1" '{kernel: $k, patches: [$p]}' |
            api /v1/images/module -X POST -d @- | jq -r .id
    }
    initramfs() {
        jq -n --arg k "$kernel" '{kernel: $k, modules: $ARGS.positional}' --args "$@" |
            api /v1/images/initramfs -X POST -d @- | jq -r .id
    }
fi
rxpageorder=$(module examples/patches/000-atlantic-rxpageorder.patch)
page_pool=$(module examples/patches/001-atlantic-page-pool.patch)
stock_initrd=$(initramfs)
rxpageorder_initrd=$(initramfs "$rxpageorder")
page_pool_initrd=$(initramfs "$page_pool")
for id in "$kernel" "$rxpageorder" "$page_pool" "$stock_initrd" "$rxpageorder_initrd" "$page_pool_initrd"; do
    case "$id" in
    kernel-* | module-* | initramfs-*) ;;
    *) echo "an image build gave no ID (got '$id')" >&2; exit 1 ;;
    esac
done
echo "kernel $kernel; modules $rxpageorder (rxpageorder), $page_pool (page_pool)" >&2
sed -e "s/@KERNEL@/$kernel/" \
    -e "s/@INITRD_STOCK@/$stock_initrd/" \
    -e "s/@INITRD_RXPAGEORDER@/$rxpageorder_initrd/" \
    -e "s/@INITRD_PAGE_POOL@/$page_pool_initrd/" "$template"
