#!/usr/bin/env bash
# Summarizes a `cargo test -- --show-output` log: tests passed, failed and skipped, each test
# counted once by its name, a skipped test not counted as passed; then every skip with its
# reason. Tests that cannot run here print `SKIP test_name: reason` and return.
#
# With DRIVERLAB_REQUIRE=1 (.ci/run sets it on a root machine with /dev/kvm), a skip is a failure
# unless the test is one that needs what no CI machine has (hardware: a real NIC on vfio-pci,
# hardware virtualization for Linux under the VMM directly); the summary then exits 1.
set -euo pipefail
log=$1
# Tests that may skip even where everything the project installs is there.
may_skip="host_passes_the_preflight probe_sees_the_real_device_behind_the_iommu_and_it_resets \
linux_matrix_stock_against_page_pool_under_driverlab debian_vmlinux_boots_via_pvh \
debian_bzimage_is_entered_at_its_64_bit_entry"
ran=$(grep -oE '^test result: [A-Za-z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -oE '; [0-9]+ failed' "$log" | awk '{s+=$2} END {print s+0}')
# One line per skipped test: its name, then its first reason.
skips=$(grep -E '^SKIP [A-Za-z0-9_:]+: ' "$log" | sed -E 's/^SKIP ([A-Za-z0-9_:]+): (.*)$/\1\t\2/' |
    sort -t "$(printf '\t')" -k1,1 -u || true)
count=$(printf '%s' "$skips" | grep -c . || true)
passed=$((ran - count))
required=0
if [ "${DRIVERLAB_REQUIRE:-}" = 1 ] && [ -n "$skips" ]; then
    while IFS="$(printf '\t')" read -r name _; do
        case " $may_skip " in
        *" $name "*) ;;
        *) required=$((required + 1)) ;;
        esac
    done <<<"$skips"
fi
echo
echo "summary: $passed passed, $failed failed, $count skipped"
if [ -n "$skips" ]; then
    printf '%s\n' "$skips" | sed -E "s/^([^\t]*)\t/  skipped: \1: /"
fi
if [ "$required" -gt 0 ]; then
    echo "DRIVERLAB_REQUIRE: $required test(s) skipped that must run here; see above" >&2
    exit 1
fi
