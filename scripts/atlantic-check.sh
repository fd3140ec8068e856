#!/usr/bin/env bash
# The Linux check: Debian's unmodified atlantic driver (kernel 6.12) drives driverlab's AQC100
# model, served over vfio-user by its own process, in a QEMU 11 (TCG) guest behind a
# virtio-iommu. The guest probes the device, brings the link up, pings a peer, runs iperf3 both
# ways, takes the link down and up, pings again and unloads the driver; any failed step, kernel
# warning/BUG/Oops or IOMMU fault fails the check. See usage() for the layout.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/atlantic-check.sh [options]      (as root)

Boots Debian's 6.12 kernel in forky's QEMU 11 (TCG, q35, virtio-iommu, memfd guest RAM)
with the AQC100 model attached as a vfio-user-pci device, and checks that the stock atlantic
driver works with it. The model runs in a network namespace (the peer) whose TAP device has
the peer's address and an `iperf3 -s`; the guest reaches the peer through the model.

  guest 10.77.0.2/24  --atlantic--> model --TAP dltap0--> netns dlcheck-PID: 10.77.0.1/24, iperf3 -s

Options:
  --model-cmd CMD  command that serves the model; {socket} and {tap} are replaced by the
                   vfio-user socket path and the TAP name. It runs inside the peer namespace.
                   Default: 'DRIVERLAB model aqc100 --socket {socket} --tap {tap}', DRIVERLAB
                   being $DRIVERLAB_BIN, else the newer of target/release/driverlab and
                   target/debug/driverlab.
  --duration S     seconds of each iperf3 run (default 10; TCG is slow, keep it short)
  --timeout S      kill the guest after S seconds (default 300 + 3 x duration)
  --smp N          guest CPUs (default 1; atlantic then uses 1 queue and 3 vectors)
  --append ARGS    extra kernel parameters, e.g. 'iommu.strict=1' or 'atlantic.rxpageorder=3'
  --patch FILE     a driver variant: build the driver with this patch (repeat for a series;
                   `driverlab image module`) and boot it instead of the kernel's own module,
                   e.g. examples/patches/001-atlantic-page-pool.patch
  --logs DIR       where the logs go (default target/atlantic-check/DATE-MODE)
  --keep           keep the QEMU trace file (every guest IOMMU map/unmap; can be large)
  --nic e1000e     harness self-test: instead of the model, QEMU's emulated e1000e on the
                   same TAP, driven by the guest's e1000e driver (no model process). All the
                   network steps run for real; the expected link speed becomes 1000.
  -h, --help       this text

The kernel and the initramfs are driverlab images (`driverlab image kernel`, `driverlab image
initramfs`): Debian's 6.12 kernel, and busybox, iperf3, ethtool, the modules and the guest agent
as /init. The agent reports each step as a frame on COM2 (agent.log).

Logs: console.log (kernel console), agent.log (the agent's frames), model.log,
iperf3-server.log, qemu.log (QEMU's stderr), qemu.cmd, summary.txt. The verdict is
`driverlab agent verdict LOGDIR` (lab::agent): PASS only if the agent finished with every step
ok, no kernel WARNING, BUG, Oops, lockup, tx timeout or IOMMU fault shows, QEMU reported no
error, and the model's counters show no refused DMA (this setup's IOMMU faults).
EOF
}

cd "$(dirname "$0")/.."
repo=$(pwd)
. scripts/lib.sh

nic=atlantic
duration=10
timeout_s=""
smp=1
append=""
logdir=""
keep=0
model_cmd=""
patches=()
while [ $# -gt 0 ]; do
    case "$1" in
        --model-cmd) model_cmd="${2:?--model-cmd needs a command}"; shift ;;
        --duration) duration="${2:?--duration needs seconds}"; shift ;;
        --timeout) timeout_s="${2:?--timeout needs seconds}"; shift ;;
        --smp) smp="${2:?--smp needs a number}"; shift ;;
        --append) append="${2:?--append needs kernel parameters}"; shift ;;
        --patch) patches+=(--patch "$(realpath "${2:?--patch needs a file}")"); shift ;;
        --logs) logdir="${2:?--logs needs a directory}"; shift ;;
        --keep) keep=1 ;;
        --nic) nic="${2:?--nic needs atlantic or e1000e}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$nic" in atlantic|e1000e) ;; *) echo "--nic must be atlantic or e1000e" >&2; exit 2 ;; esac
for n in "$duration" "$smp" ${timeout_s:+"$timeout_s"}; do
    case "$n" in ''|*[!0-9]*) echo "not a whole number: '$n'" >&2; exit 2 ;; esac
done
timeout_s=${timeout_s:-$((300 + 3 * duration))}
if [ "$(id -u)" -ne 0 ]; then
    # Network namespaces, TAP devices, mounts and chroot all need root.
    echo "run this as root: sudo $0 $*" >&2
    exit 1
fi

# Addresses of the guest and of the peer namespace. The namespace is private to this run, so
# the subnet cannot collide with the host's routes.
guest_ip=10.77.0.2
peer_ip=10.77.0.1
prefix=24
tap=dltap0
netns=dlcheck-$$
case "$nic" in
    atlantic) speed=10000 ;; # AQC100 is a 10G part; the model must report 10G
    e1000e) speed=1000 ;;
esac

log() { echo "atlantic-check: $*" >&2; }
now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# --- Model command ------------------------------------------------------------------------------
if [ "$nic" = atlantic ] && [ -z "$model_cmd" ]; then
    bin="${DRIVERLAB_BIN:-}"
    if [ -z "$bin" ]; then
        # The newer of the two builds: the one the developer most likely just made.
        for candidate in target/release/driverlab target/debug/driverlab; do
            if [ -x "$candidate" ] && { [ -z "$bin" ] || [ "$candidate" -nt "$bin" ]; }; then
                bin=$candidate
            fi
        done
    fi
    if [ -z "$bin" ] || [ ! -x "$bin" ]; then
        echo "no driverlab binary: build it (cargo build --release), set DRIVERLAB_BIN," \
            "pass --model-cmd, or self-test the harness with --nic e1000e" >&2
        exit 1
    fi
    bin=$(realpath "$bin")
    model_cmd="$bin model aqc100 --socket {socket} --tap {tap}"
fi

# --- Inputs (each cached) ----------------------------------------------------------------------
t_start=$(now)
root=$(scripts/fetch-forky-qemu.sh)
t_chroot=$(now)
# driverlab itself builds the images: the e1000e self-test needs the binary too.
bin="${bin:-${DRIVERLAB_BIN:-}}"
if [ -z "$bin" ]; then
    for candidate in target/release/driverlab target/debug/driverlab; do
        if [ -x "$candidate" ] && { [ -z "$bin" ] || [ "$candidate" -nt "$bin" ]; }; then
            bin=$candidate
        fi
    done
fi
[ -x "$bin" ] || { echo "no driverlab binary: cargo build --release, or set DRIVERLAB_BIN" >&2; exit 1; }
apt_install busybox-static iperf3 ethtool iproute2
kernel_id=$("$bin" image kernel | tail -n 1)
kernel=$("$bin" image path "$kernel_id" bzImage)
kver=$("$bin" image show "$kernel_id" | sed -n 's/^ *"release": "\(.*\)",$/\1/p')
t_kernel=$(now)
variant=()
if [ ${#patches[@]} -gt 0 ]; then
    ko=$("$bin" image module --kernel "$kernel_id" "${patches[@]}" | tail -n 1)
    log "driver variant: $ko"
    variant=(--module "$ko")
fi
initrd=$("$bin" image initramfs --kernel "$kernel_id" --driver "$nic" "${variant[@]}" | tail -n 1)
t_initrd=$(now)

# --- Run directories ---------------------------------------------------------------------------
logdir=${logdir:-$repo/target/atlantic-check/$(date +%Y%m%d-%H%M%S)-$nic}
mkdir -p "$logdir"
logdir=$(realpath "$logdir")
# The socket gets a short path of its own: Unix socket paths are limited to 108 bytes.
sockdir=$(mktemp -d /tmp/dlcheck.XXXXXX)
socket=$sockdir/aqc100.sock
model_pid=""
iperf_pid=""
qemu_pid=""

# Stops what this run started, by process id, and removes the namespace. Runs on every exit.
stop_pid() { # PID [NAME]: TERM, then KILL after 5 s; the process group when it leads one
    local pid="$1" target="$1"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    [ "$(ps -o pgid= -p "$pid" | tr -d ' ')" = "$pid" ] && target="-$pid"
    kill -TERM -- "$target" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "${2:-process $pid} did not stop on SIGTERM; killing it"
        kill -KILL -- "$target" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_pid "$qemu_pid" QEMU
    stop_pid "$model_pid" model
    stop_pid "$iperf_pid" "iperf3 server"
    if ip netns list | grep -q "^$netns\\b"; then
        ip -n "$netns" link del "$tap" 2>/dev/null || true
        ip netns del "$netns" || log "could not delete network namespace $netns (ip netns del $netns)"
    fi
    rm -rf "$sockdir"
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

# --- The peer: namespace, TAP, address, iperf3 server -------------------------------------------
log "peer: netns $netns, $tap $peer_ip/$prefix, iperf3 -s; logs in $logdir"
ip netns add "$netns"
ip -n "$netns" link set lo up
# A persistent TAP (no packet info header, single queue) that the model, or QEMU in e1000e
# mode, attaches to by name. It has no carrier until then; the address works regardless.
ip -n "$netns" tuntap add dev "$tap" mode tap
ip -n "$netns" addr add "$peer_ip/$prefix" dev "$tap"
ip -n "$netns" link set "$tap" up
setsid ip netns exec "$netns" iperf3 -s -B "$peer_ip" >"$logdir/iperf3-server.log" 2>&1 </dev/null &
iperf_pid=$!

# --- The model ----------------------------------------------------------------------------------
if [ "$nic" = atlantic ]; then
    cmd=${model_cmd//\{socket\}/$socket}
    cmd=${cmd//\{tap\}/$tap}
    log "model: $cmd"
    echo "$cmd" >"$logdir/model.cmd"
    # Its own process group, so that cleanup stops everything the command starts.
    # NO_COLOR: plain text in model.log.
    NO_COLOR=1 setsid ip netns exec "$netns" bash -c "exec $cmd" >"$logdir/model.log" 2>&1 </dev/null &
    model_pid=$!
    for _ in $(seq 300); do
        [ -S "$socket" ] && break
        if ! kill -0 "$model_pid" 2>/dev/null; then
            wait "$model_pid" && rc=0 || rc=$?
            log "the model exited (status $rc) before creating $socket; its log:"
            tail -n 20 "$logdir/model.log" >&2
            exit 1
        fi
        sleep 0.1
    done
    if [ ! -S "$socket" ]; then
        log "the model did not create $socket within 30 s; see $logdir/model.log"
        exit 1
    fi
fi
if ! kill -0 "$iperf_pid" 2>/dev/null; then
    log "iperf3 -s exited; see $logdir/iperf3-server.log"
    exit 1
fi

# --- QEMU ---------------------------------------------------------------------------------------
cmdline="console=ttyS0 loglevel=5 panic=-1 oops=panic mitigations=off"
cmdline+=" driverlab.nic=$nic driverlab.ip=$guest_ip/$prefix driverlab.peer=$peer_ip driverlab.speed=$speed"
cmdline+=" driverlab.iperf=tx,$duration,4,1,tcp+rx,$duration,4,1,tcp driverlab.check=1 $append"
# Paths as QEMU sees them inside the chroot (mounted below).
# shellcheck disable=SC2054  # the commas belong to QEMU's option syntax
qemu=(qemu-system-x86_64
    -machine q35,memory-backend=mem -accel tcg -smp "$smp" -m 512M
    # vfio-user passes guest RAM to the model as file descriptors: it must be a shared memfd.
    -object memory-backend-memfd,id=mem,size=512M,share=on
    # No default devices: q35 would add its own e1000e NIC and a VGA card.
    -nodefaults -no-user-config -display none -monitor none -no-reboot
    # ttyS0: the kernel console and the agent's progress; ttyS1: the agent's frames.
    -serial file:/dlrun/console.log -serial file:/dlrun/agent.log
    -kernel /dlboot/bzImage -initrd /dlboot/initrd.gz -append "$cmdline"
    -device virtio-iommu-pci
    -msg timestamp=on -D /dlrun/qemu-trace.log
    -trace virtio_iommu_map -trace virtio_iommu_unmap -trace virtio_iommu_report_fault)
if [ "$nic" = atlantic ]; then
    qemu+=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"/dlsock/aqc100.sock\",\"type\":\"unix\"}}"
        -trace vfio_user_dma_map -trace vfio_user_dma_unmap)
else
    # romfile= : no PXE option ROM; direct kernel boot does not need one.
    # shellcheck disable=SC2054
    qemu+=(-netdev "tap,id=n0,ifname=$tap,script=no,downscript=no"
        -device e1000e,netdev=n0,mac=52:54:00:12:34:56,romfile=)
fi
printf '%q ' "${qemu[@]}" >"$logdir/qemu.cmd"
echo >>"$logdir/qemu.cmd"

# QEMU runs from the forky chroot in a private mount namespace: the mounts it needs (/dev,
# /proc, the log and socket directories, a tmpfs with kernel and initramfs) vanish with it and
# never show up on the host, so nothing is left mounted inside the cached chroot. In e1000e
# mode it also runs in the peer namespace, where its TAP is.
mkdir -p "$root/dlrun" "$root/dlsock" "$root/dlboot"
# shellcheck disable=SC2016  # expanded by the inner shell, from its arguments
inner='set -e
root=$1 logdir=$2 sockdir=$3 kernel=$4 initrd=$5; shift 5
mount --rbind /dev "$root/dev"
mount -t proc proc "$root/proc"
mount --bind "$logdir" "$root/dlrun"
mount --bind "$sockdir" "$root/dlsock"
mount -t tmpfs -o size=64m tmpfs "$root/dlboot"
cp "$kernel" "$root/dlboot/bzImage"
cp "$initrd" "$root/dlboot/initrd.gz"
exec chroot "$root" "$@"'
launcher=(unshare --mount --propagation private sh -c "$inner" sh "$root" "$logdir" "$sockdir" "$kernel" "$initrd")
[ "$nic" = e1000e ] && launcher=(ip netns exec "$netns" "${launcher[@]}")

log "booting $kernel_id ($kver, $nic, $smp CPU, iperf3 ${duration} s, time limit ${timeout_s} s)"
t_boot=$(now)
timeout --kill-after=10 "$timeout_s" "${launcher[@]}" "${qemu[@]}" \
    >/dev/null 2>"$logdir/qemu.log" </dev/null &
qemu_pid=$!
# Poll rather than wait: a model that dies mid-run would otherwise leave the guest waiting
# for its device until the time limit.
model_died=""
while kill -0 "$qemu_pid" 2>/dev/null; do
    if [ -n "$model_pid" ] && [ -z "$model_died" ] && ! kill -0 "$model_pid" 2>/dev/null; then
        wait "$model_pid" && rc=0 || rc=$?
        model_died="the model exited (status $rc) while the guest was running"
        log "$model_died; stopping QEMU"
        stop_pid "$qemu_pid" QEMU
    fi
    sleep 0.5
done
wait "$qemu_pid" && qemu_rc=0 || qemu_rc=$?
qemu_pid=""
t_end=$(now)
# The model prints its counters (DMA maps, unmaps, faults, frames) as one JSON line when its
# client goes away; give it a moment to do so, then stop it so that its log is complete.
if [ -n "$model_pid" ]; then
    for _ in $(seq 50); do
        grep -q '"counters"' "$logdir/model.log" && break
        kill -0 "$model_pid" 2>/dev/null || break
        sleep 0.1
    done
    stop_pid "$model_pid" model
    model_pid=""
fi

# --- Verdict: the agent's frames and the logs, judged in Rust -------------------------------------
problems=()
case "$qemu_rc" in
    0) ;;
    124|137) problems+=("time limit of ${timeout_s} s reached (QEMU killed)") ;;
    *) problems+=("QEMU exited with status $qemu_rc (see qemu.log)") ;;
esac
[ -n "$model_died" ] && problems+=("$model_died (see model.log)")
[ "$nic" = e1000e ] && rm -f "$logdir/model.log"
{
    echo "driverlab Linux check: nic=$nic kernel=$kver ($kernel_id) $(chroot "$root" qemu-system-x86_64 --version | head -n 1)"
    [ "$nic" = atlantic ] && echo "model: $(cat "$logdir/model.cmd")"
    verdict=$("$bin" agent verdict "$logdir") && verdict_ok=1 || verdict_ok=0
    grep -v '^result: ' <<<"$verdict" | sed '/^  - /d'
    if [ -f "$logdir/qemu-trace.log" ] && [ "$keep" != 1 ]; then rm -f "$logdir/qemu-trace.log"; fi
    echo "wall time: chroot $(elapsed "$t_start" "$t_chroot") s, kernel $(elapsed "$t_chroot" "$t_kernel") s," \
        "initramfs $(elapsed "$t_kernel" "$t_initrd") s, guest $(elapsed "$t_boot" "$t_end") s"
    if [ "$verdict_ok" = 0 ]; then
        while IFS= read -r p; do problems+=("$p"); done < <(sed -n 's/^  - //p' <<<"$verdict")
    fi
    if [ ${#problems[@]} -eq 0 ]; then
        echo "result: PASS"
    else
        echo "result: FAIL"
        printf '  - %s\n' "${problems[@]}"
    fi
    echo "logs: $logdir"
} | tee "$logdir/summary.txt"
grep -q '^result: PASS$' "$logdir/summary.txt"
