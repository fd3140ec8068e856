#!/usr/bin/env bash
# Summarizes a `cargo test -- --show-output` log: passed and failed test counts, then every skip
# (tests print `SKIP name: reason` when the host lacks what they need) with its reason.
set -euo pipefail
log=$1
passed=$(grep -oE '^test result: [A-Za-z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -oE '; [0-9]+ failed' "$log" | awk '{s+=$2} END {print s+0}')
skips=$(grep -E '^SKIP ' "$log" | sort -u || true)
count=$(printf '%s' "$skips" | grep -c . || true)
echo
echo "summary: $passed passed, $failed failed, $count skipped"
if [ -n "$skips" ]; then
    printf '%s\n' "$skips" | sed 's/^SKIP /  skipped: /'
fi
