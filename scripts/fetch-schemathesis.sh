#!/usr/bin/env bash
# Prints the path of schemathesis's `st`, installed once from PyPI into a virtual environment
# in the cache (pinned, so that a new release cannot turn CI red on its own).
set -euo pipefail
version=4.32.5
venv="${DRIVERLAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/driverlab}/schemathesis-$version"
if [ -x "$venv/bin/st" ] && "$venv/bin/st" --version >/dev/null 2>&1; then
    echo "$venv/bin/st"
    exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv" >&2
"$venv/bin/pip" install --quiet "schemathesis==$version" >&2
"$venv/bin/st" --version >&2
echo "$venv/bin/st"
