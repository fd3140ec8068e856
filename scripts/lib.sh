# shellcheck shell=bash
# Shared by the scripts: privileged commands and apt installs.

# Runs a command as root: directly when root, through sudo otherwise.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs Debian packages that are missing (one apt-get update per run, only if needed).
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing: ${missing[*]}" >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >&2
}

# Makes sure a Rust toolchain with the probe guest's target is there.
ensure_rust() {
    if ! command -v cargo >/dev/null 2>&1; then
        [ -x "$HOME/.cargo/bin/cargo" ] || {
            echo "installing Rust with rustup" >&2
            curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >&2
        }
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    if command -v rustup >/dev/null 2>&1; then
        rustup target add x86_64-unknown-none >&2
        rustup component add rustfmt clippy >&2
    elif ! rustc --print target-list | grep -qx x86_64-unknown-none; then
        echo "the probe guest needs the x86_64-unknown-none target; install Rust with rustup" >&2
        return 1
    fi
}
