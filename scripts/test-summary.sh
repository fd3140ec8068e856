#!/usr/bin/env bash
# Summarizes a `cargo test -- --show-output` log: tests passed, failed and skipped, each test
# counted once by its name, a skipped test not counted as passed; then every skip with its
# reason. Tests that cannot run here print `SKIP test_name: reason` and return.
#
# With DRIVERLAB_REQUIRE=1 (.ci/run sets it on a root machine with /dev/kvm) a test whose skip
# is not for hardware no CI machine has fails itself (tests/common's `skip`); this summary only
# counts and lists.
set -euo pipefail
log=$1
ran=$(grep -oE '^test result: [A-Za-z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -oE '; [0-9]+ failed' "$log" | awk '{s+=$2} END {print s+0}')
# One line per skipped test: its name, then its first reason.
skips=$(grep -E '^SKIP [A-Za-z0-9_:]+: ' "$log" | sed -E 's/^SKIP ([A-Za-z0-9_:]+): (.*)$/\1\t\2/' |
    sort -t "$(printf '\t')" -k1,1 -u || true)
count=$(printf '%s' "$skips" | grep -c . || true)
passed=$((ran - count))
echo
echo "summary: $passed passed, $failed failed, $count skipped"
if [ -n "$skips" ]; then
    printf '%s\n' "$skips" | sed -E "s/^([^\t]*)\t/  skipped: \1: /"
fi
