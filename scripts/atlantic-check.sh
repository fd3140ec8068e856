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
  --append ARGS    extra kernel parameters, e.g. 'iommu.strict=1'
  --logs DIR       where the logs go (default target/atlantic-check/DATE-MODE)
  --keep           keep the QEMU trace file (every guest IOMMU map/unmap; can be large)
  --nic e1000e     harness self-test: instead of the model, QEMU's emulated e1000e on the
                   same TAP, driven by the guest's e1000e driver (no model process). All the
                   network steps run for real; the expected link speed becomes 1000.
  -h, --help       this text

Logs: console.log (kernel console and /init), dlcheck.log (the DLCHECK lines with host
time stamps), model.log, iperf3-server.log, qemu.log (QEMU's stderr), qemu.cmd, summary.txt.
The guest prints lines 'DLCHECK step=NAME begin|ok|fail|skip [key=value ...]' and finally
'DLCHECK done ok|fail'; see scripts/build-atlantic-initramfs.sh.

Exit status 0 only if the guest finished within the time limit with every step ok, and
  - neither the console nor the guest's dmesg shows a kernel WARNING, BUG, Oops, lockup,
    tx timeout or IOMMU fault,
  - QEMU's stderr has no line with "error" outside warnings (e.g. a vfio-user request the
    model refused),
  - the model's last counters line (JSON on its stderr, '{"model":...}') exists and has
    "dma_faults":0: a DMA outside the guest's mappings is this setup's IOMMU fault.
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
while [ $# -gt 0 ]; do
    case "$1" in
        --model-cmd) model_cmd="${2:?--model-cmd needs a command}"; shift ;;
        --duration) duration="${2:?--duration needs seconds}"; shift ;;
        --timeout) timeout_s="${2:?--timeout needs seconds}"; shift ;;
        --smp) smp="${2:?--smp needs a number}"; shift ;;
        --append) append="${2:?--append needs kernel parameters}"; shift ;;
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
# Kernel faults that fail the check. The guest's /init greps its dmesg for the same expression
# (scripts/build-atlantic-initramfs.sh); keep the two in step.
faults='WARNING:|BUG:|Oops|general protection fault|Unable to handle|Call Trace|NETDEV WATCHDOG|soft lockup|hard LOCKUP|rcu.*stall|blocked for more than|page allocation failure|fault from EP|[Ii][Oo][Mm][Mm][Uu].*[^A-Za-z][Ff]ault|DMAR:.*[^A-Za-z][Ff]ault|AMD-Vi:.*([^A-Za-z][Ff]ault|Event)|swiotlb buffer is full|DMA-API'

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
moddir=$(scripts/fetch-debian-kernel.sh --modules)
kernel=$(scripts/fetch-debian-kernel.sh)
kver=$(basename "$moddir")
if [ "$(basename "$kernel")" != "vmlinuz-$kver" ]; then
    echo "kernel $kernel does not match the modules in $moddir; delete the kernel cache and rerun" >&2
    exit 1
fi
t_kernel=$(now)
initrd=$(scripts/build-atlantic-initramfs.sh --modules "$moddir")
t_initrd=$(now)
apt_install iperf3 iproute2

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
reader_pid=""

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
    if [ -n "$reader_pid" ]; then wait "$reader_pid" 2>/dev/null || true; fi
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
cmdline+=" dlcheck.nic=$nic dlcheck.ip=$guest_ip/$prefix dlcheck.peer=$peer_ip"
cmdline+=" dlcheck.duration=$duration dlcheck.speed=$speed dlcheck.out=/dev/ttyS1 $append"
# Paths as QEMU sees them inside the chroot (mounted below).
# shellcheck disable=SC2054  # the commas belong to QEMU's option syntax
qemu=(qemu-system-x86_64
    -machine q35,memory-backend=mem -accel tcg -smp "$smp" -m 512M
    # vfio-user passes guest RAM to the model as file descriptors: it must be a shared memfd.
    -object memory-backend-memfd,id=mem,size=512M,share=on
    # No default devices: q35 would add its own e1000e NIC and a VGA card.
    -nodefaults -no-user-config -display none -monitor none -no-reboot
    # ttyS0: kernel console and /init's output; ttyS1: only the DLCHECK lines, on stdout.
    -serial file:/dlrun/console.log -serial stdio
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

# Reads the DLCHECK channel: stamps each line with the host time (to attribute trace records
# to steps) and shows progress.
read_guest() {
    local line t0
    t0=$(now)
    while IFS= read -r line; do
        line=${line%$'\r'}
        printf '%s %s\n' "$(now)" "$line" >>"$logdir/dlcheck.log"
        case "$line" in
            "DLCHECK step="*" begin") ;;
            DLCHECK*) log "[$(elapsed "$t0" "$(now)") s] ${line#DLCHECK }" ;;
        esac
    done
}
mkfifo "$sockdir/ttyS1"
read_guest <"$sockdir/ttyS1" &
reader_pid=$!
log "booting $kver ($nic, $smp CPU, iperf3 ${duration} s, time limit ${timeout_s} s)"
: >"$logdir/dlcheck.log"
t_boot=$(now)
timeout --kill-after=10 "$timeout_s" "${launcher[@]}" "${qemu[@]}" \
    >"$sockdir/ttyS1" 2>"$logdir/qemu.log" </dev/null &
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
wait "$reader_pid" || true
reader_pid=""
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

# --- Verdict ------------------------------------------------------------------------------------
problems=()
case "$qemu_rc" in
    0) ;;
    124|137) problems+=("time limit of ${timeout_s} s reached (QEMU killed)") ;;
    *) problems+=("QEMU exited with status $qemu_rc (see qemu.log)") ;;
esac
[ -n "$model_died" ] && problems+=("$model_died (see model.log)")

dl="$logdir/dlcheck.log"
# Last result per step, in order of first appearance: "name status rest"; a step that began
# but never reported (the guest hung or died in it) is "unfinished".
results=$(awk '$2 == "DLCHECK" && $3 ~ /^step=/ {
        name = substr($3, 6); if (!(name in line)) order[++n] = name
        if ($4 == "begin") { line[name] = "unfinished"; next }
        rest = ""; for (i = 5; i <= NF; i++) rest = rest " " $i; line[name] = $4 rest
    } END { for (i = 1; i <= n; i++) print order[i], line[order[i]] }' "$dl")
done_line=$(awk '$2 == "DLCHECK" && $3 == "done" { $1 = $2 = $3 = ""; print substr($0, 4) }' "$dl" | tail -n 1)
if [ -z "$done_line" ]; then
    last_begun=$(awk '$2 == "DLCHECK" && $4 == "begin" { s = substr($3, 6) } END { print s }' "$dl")
    problems+=("the guest did not finish; last step begun: ${last_begun:-none (no DLCHECK line: did it boot? see console.log)}")
fi
# Every failed step (the done line lists them too, but may be missing).
while read -r name status rest; do
    if [ -n "$name" ] && [ "$status" = fail ]; then
        problems+=("step $name failed: $(sed -n 's/^reason=\([^ ]*\).*/\1/p' <<<"$rest" | tr _ ' ')")
    fi
done <<<"$results"
if [ -n "$done_line" ] && [ "${done_line%% *}" != ok ] && ! grep -q ' fail ' <<<"$results"; then
    problems+=("guest: $done_line")
fi

# Kernel faults anywhere on the console, including ones that killed the guest before its own
# dmesg step (the /init's fail line quotes them, so skip DLCHECK lines here).
fault_lines=$(tr -d '\r' <"$logdir/console.log" 2>/dev/null | grep -v '^DLCHECK ' | grep -E "$faults" | sort -u || true)
[ -n "$fault_lines" ] && problems+=("kernel faults on the console: $(wc -l <<<"$fault_lines") distinct lines")

# Behind a virtual IOMMU served over vfio-user, a device access outside the guest's mappings
# never reaches the guest as an IOMMU fault: the model refuses it and counts it. Those are this
# setup's IOMMU faults, so they fail the check too.
model_counters=""
if [ "$nic" = atlantic ]; then
    model_counters=$(grep -o '{"model".*' "$logdir/model.log" | tail -n 1 || true)
    dma_faults=$(grep -o '"dma_faults":[0-9]*' <<<"$model_counters" | cut -d: -f2 || true)
    if [ -z "$model_counters" ]; then
        problems+=("the model printed no counters line (see model.log)")
    elif [ "${dma_faults:-0}" -gt 0 ]; then
        problems+=("the model refused $dma_faults DMA accesses outside the guest's mappings (IOMMU faults; see model.log)")
    fi
fi
# QEMU's stderr: vfio-user protocol errors (an error reply to a DMA_MAP, say) land there.
# Warnings ("warning: ...") are QEMU telling what it could not set up, not failures.
qemu_errors=$(grep -i 'error' "$logdir/qemu.log" | grep -v 'warning:' | sort | uniq -c | sort -rn || true)
[ -n "$qemu_errors" ] && problems+=("QEMU reported errors: $(grep -c . <<<"$qemu_errors") distinct lines in qemu.log")

# IOMMU activity from QEMU's trace: totals, and counts inside each step's time window (host time
# stamps of its begin and result lines). With -msg timestamp=on, QEMU 11 starts each trace line
# with an ISO 8601 UTC time, "2026-11-30T23:22:59.155058Z virtio_iommu_map domain=1 ...";
# awk turns it into Unix time by the days-from-civil formula (mawk has no mktime).
trace="$logdir/qemu-trace.log"
dma_report=""
if [ -f "$trace" ]; then
    dma_report=$(awk '
        function unixtime(iso,    y, m, d, era, yoe, doy, doe) {
            y = substr(iso, 1, 4) + 0; m = substr(iso, 6, 2) + 0; d = substr(iso, 9, 2) + 0
            y -= (m <= 2); era = int(y / 400); yoe = y - era * 400
            doy = int((153 * (m + (m > 2 ? -3 : 9)) + 2) / 5) + d - 1
            doe = yoe * 365 + int(yoe / 4) - int(yoe / 100) + doy
            return (era * 146097 + doe - 719468) * 86400 + substr(iso, 12, 2) * 3600 \
                + substr(iso, 15, 2) * 60 + substr(iso, 18)
        }
        FNR == NR {
            if ($2 != "DLCHECK" || $3 !~ /^step=/) next
            name = substr($3, 6)
            if ($4 == "begin") { start[name] = $1; order[++n] = name } else if (name in start) stop[name] = $1
            next
        }
        $1 ~ /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T/ {
            ev = $2; total[ev]++; at = unixtime($1)
            for (i = 1; i <= n; i++) {
                s = order[i]
                if ((s in stop) && at >= start[s] && at <= stop[s]) per[s, ev]++
            }
        }
        END {
            printf "  %-14s", "whole run:"; for (e in total) printf " %s=%d", e, total[e]; print ""
            for (i = 1; i <= n; i++) {
                s = order[i]; line = ""
                for (e in total) if ((s, e) in per) line = line sprintf(" %s=%d", e, per[s, e])
                if (line != "") printf "  %-14s%s\n", s ":", line
            }
        }' "$dl" "$trace")
    if grep -q virtio_iommu_report_fault "$trace"; then
        problems+=("QEMU's virtio-iommu reported translation faults (see qemu-trace.log)")
        keep=1
    fi
    [ "$keep" = 1 ] || rm -f "$trace"
fi

# --- Summary ------------------------------------------------------------------------------------
first_step=$(awk '$2 == "DLCHECK" && $3 == "step=boot" { print $1; exit }' "$dl")
# field STEP KEY: the value of KEY= in STEP's last ok line, or n/a.
field() {
    awk -v s="step=$1" -v k="$2=" '$2 == "DLCHECK" && $3 == s && $4 == "ok" {
            for (i = 5; i <= NF; i++) if (index($i, k) == 1) v = substr($i, length(k) + 1)
        } END { print (v == "" ? "n/a" : v) }' "$dl"
}
{
    echo "driverlab Linux check: nic=$nic kernel=$kver $(chroot "$root" qemu-system-x86_64 --version | head -n 1)"
    [ "$nic" = atlantic ] && echo "model: $(cat "$logdir/model.cmd")"
    echo "steps:"
    if [ -n "$results" ]; then
        while read -r name status rest; do
            printf '  %-14s %-5s %s\n' "$name" "$status" "$rest"
        done <<<"$results"
    else
        echo "  (none reported)"
    fi
    echo "throughput (iperf3, ${duration} s each): guest->peer $(field iperf-tx mbps) Mbit/s, peer->guest $(field iperf-rx mbps) Mbit/s"
    if [ -n "$dma_report" ]; then
        echo "IOMMU maps/unmaps (QEMU trace; vfio_user_dma_* are what the model received):"
        echo "$dma_report"
    fi
    [ -n "$model_counters" ] && echo "model counters: $model_counters"
    if [ -n "$qemu_errors" ]; then
        echo "QEMU errors (count, message):"
        head -n 10 <<<"$qemu_errors" | sed 's/^ */  /'
    fi
    if [ -n "$fault_lines" ]; then
        echo "kernel faults:"
        head -n 20 <<<"$fault_lines" | sed 's/^/  /'
    else
        echo "kernel faults: none"
    fi
    echo "wall time: chroot $(elapsed "$t_start" "$t_chroot") s, kernel+modules $(elapsed "$t_chroot" "$t_kernel") s," \
        "initramfs $(elapsed "$t_kernel" "$t_initrd") s," \
        "boot to /init $([ -n "$first_step" ] && echo "$(elapsed "$t_boot" "$first_step") s" || echo n/a)," \
        "iperf $(field iperf-tx secs)+$(field iperf-rx secs) s, guest total $(elapsed "$t_boot" "$t_end") s"
    if [ ${#problems[@]} -eq 0 ]; then
        echo "result: PASS"
    else
        echo "result: FAIL"
        printf '  - %s\n' "${problems[@]}"
    fi
    echo "logs: $logdir"
} | tee "$logdir/summary.txt"
[ ${#problems[@]} -eq 0 ]
