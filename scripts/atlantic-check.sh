#!/usr/bin/env bash
# The Linux check: Debian's unmodified atlantic driver (kernel 6.12), or a variant built with
# --patch, drives driverlab's AQC100 model in a QEMU 11 (TCG) guest behind a virtio-iommu. It is
# one cell of the lab under its QEMU engine (docs/lab.md, "Engines"): this script writes that
# one-cell matrix, runs it with `driverlab lab run`, and prints the guest agent's steps and the
# verdict. See usage() for what runs.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/atlantic-check.sh [options]      (as root)

Runs one lab cell under the QEMU engine: Debian's 6.12 kernel (`driverlab image kernel`), the
agent's initramfs with the stock atlantic driver or a variant (`driverlab image module`,
`image initramfs`), forky's QEMU 11 (`driverlab engine setup qemu`; TCG, q35, virtio-iommu,
memfd guest RAM) and a fresh AQC100 model attached as vfio-user-pci, its wire a TAP in the
peer's network namespace where iperf3 -s runs:

  guest 10.77.0.2/24, fd77::2/64 --atlantic--> model --TAP dltap0--> netns: 10.77.0.1, fd77::1, iperf3 -s

The guest probes the device, brings the link up, pings the peer, runs iperf3 from the peer
(-R), takes the link down and up, pings again and unloads the driver. Any failed step, kernel
WARNING/BUG/Oops, lockup, tx timeout, IOMMU fault, refused DMA or IOMMU mapping left after the
unload fails the check.

Options:
  --duration S     seconds of the iperf3 run (default 10; TCG is slow, keep it short)
  --timeout S      stop the guest after S seconds (default 300 + 3 x duration)
  --smp N          guest CPUs (default 1; atlantic then uses 1 queue and 3 vectors)
  --append ARGS    extra kernel parameters, e.g. 'iommu.strict=1' or 'atlantic.rxpageorder=3'
  --patch FILE     a driver variant: build the driver with this patch (repeat for a series)
                   and boot it instead of the kernel's own module,
                   e.g. examples/patches/001-atlantic-page-pool.patch
  --logs DIR       where the matrix, the lab's database and the artifacts go
                   (default target/atlantic-check/DATE)
  --keep           keep QEMU's trace file (every guest IOMMU map/unmap; can be large)
  -h, --help       this text

The driverlab binary is $DRIVERLAB_BIN, else the newer of target/release/driverlab and
target/debug/driverlab. Logs: LOGS/check.toml (the matrix), LOGS/lab.db, and in
LOGS/artifacts/RUN/c01/rep0: serial.log (the kernel console), agent.log (the agent's frames),
qemu.log (QEMU's stderr), qemu-trace.log (with --keep). The last line is `result: PASS` or
`result: FAIL`, the exit code 0 or 1.
EOF
}

cd "$(dirname "$0")/.."
repo=$(pwd)
. scripts/lib.sh

duration=10
timeout_s=""
smp=1
append=""
logdir=""
keep=0
patches=()
while [ $# -gt 0 ]; do
    case "$1" in
        --duration) duration="${2:?--duration needs seconds}"; shift ;;
        --timeout) timeout_s="${2:?--timeout needs seconds}"; shift ;;
        --smp) smp="${2:?--smp needs a number}"; shift ;;
        --append) append="${2:?--append needs kernel parameters}"; shift ;;
        --patch) patches+=("$(realpath "${2:?--patch needs a file}")"); shift ;;
        --logs) logdir="${2:?--logs needs a directory}"; shift ;;
        --keep) keep=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for n in "$duration" "$smp" ${timeout_s:+"$timeout_s"}; do
    case "$n" in ''|*[!0-9]*) echo "not a whole number: '$n'" >&2; exit 2 ;; esac
done
timeout_s=${timeout_s:-$((300 + 3 * duration))}
case "$append" in *\"*|*\\*) echo "--append: no quotes or backslashes" >&2; exit 2 ;; esac
if [ "$(id -u)" -ne 0 ]; then
    # The peer's network namespace and TAP device need root.
    echo "run this as root: sudo $0 $*" >&2
    exit 1
fi

bin="${DRIVERLAB_BIN:-}"
if [ -z "$bin" ]; then
    # The newer of the two builds: the one the developer most likely just made.
    for candidate in target/release/driverlab target/debug/driverlab; do
        if [ -x "$candidate" ] && { [ -z "$bin" ] || [ "$candidate" -nt "$bin" ]; }; then
            bin=$candidate
        fi
    done
fi
[ -n "$bin" ] && [ -x "$bin" ] || { echo "no driverlab binary: cargo build --release, or set DRIVERLAB_BIN" >&2; exit 1; }
bin=$(realpath "$bin")

# What the images and the peer need on the host; the engine, once.
apt_install busybox-static iperf3 ethtool iproute2
"$bin" engine setup qemu >/dev/null

logdir=${logdir:-$repo/target/atlantic-check/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$logdir"
logdir=$(realpath "$logdir")
patch_list=""
for p in ${patches[@]+"${patches[@]}"}; do
    patch_list="$patch_list${patch_list:+, }\"$p\""
done
variant=stock
[ -n "$patch_list" ] && variant=patched
cat >"$logdir/check.toml" <<EOF
# Written by scripts/atlantic-check.sh: one cell of the lab under the QEMU engine.
name = "atlantic-check"
repetitions = 1
timeout_s = $timeout_s
silence_s = 120

[[device]]
name = "aqc100"
model = "aqc100"

[[image]]
name = "debian"
engine = "qemu"
kernel = "debian"
initrd = "agent"
patches = [$patch_list]
memory_mib = 512
vcpus = $smp
cmdline = "loglevel=5 oops=panic mitigations=off"

[[variant]]
name = "$variant"
image = "debian"
cmdline = "driverlab.check=1 $append"

[[workload]]
name = "rx"
kind = "iperf3"
direction = "rx"
duration_s = $duration
EOF

echo "atlantic-check: $logdir/check.toml ($variant, iperf3 -R ${duration} s, limit ${timeout_s} s)" >&2
keep_env=()
[ "$keep" = 1 ] && keep_env=(DRIVERLAB_KEEP_TRACE=1)
rc=0
env ${keep_env[@]+"${keep_env[@]}"} "$bin" lab run "$logdir/check.toml" --db "$logdir/lab.db" \
    >"$logdir/report.md" 2>"$logdir/lab.log" || rc=$?
run=$(sed -n 's/^run \([^ ]*\) started$/\1/p' "$logdir/report.md")
if [ -z "$run" ]; then
    echo "the lab did not start the run (exit $rc):" >&2
    tail -n 20 "$logdir/lab.log" >&2
    exit 1
fi
rep="$logdir/artifacts/$run/c01/rep0"
{
    echo "driverlab Linux check: run $run ($variant), logs in $rep"
    "$bin" agent verdict "$rep" | grep -v '^result: ' | sed '/^  - /d' || true
    tail -n 1 "$logdir/report.md"
    "$bin" lab show "$run" --db "$logdir/lab.db" | sed -n 's/^  c01 /record: /p'
    if [ "$rc" = 0 ]; then
        echo "result: PASS"
    else
        echo "result: FAIL"
        sed -n 's/^c01 did not always pass: /  - /p' "$logdir/report.md"
    fi
} | tee "$logdir/summary.txt"
grep -q '^result: PASS$' "$logdir/summary.txt"
