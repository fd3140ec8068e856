#!/usr/bin/env bash
# Prints the path of schemathesis's `st`, installed once from PyPI into a virtual environment
# in the cache with check-jsonschema (which checks the CI workflow against GitHub's schema),
# both pinned, so that a new release cannot turn CI red on its own.
set -euo pipefail
version=4.32.5
jsonschema_version=0.39.0
venv="${DRIVERLAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/driverlab}/schemathesis-$version-$jsonschema_version"
if [ -x "$venv/bin/st" ] && [ -x "$venv/bin/check-jsonschema" ] && "$venv/bin/st" --version >/dev/null 2>&1; then
    echo "$venv/bin/st"
    exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv" >&2
"$venv/bin/pip" install --quiet "schemathesis==$version" "check-jsonschema==$jsonschema_version" >&2
"$venv/bin/st" --version >&2
echo "$venv/bin/st"
