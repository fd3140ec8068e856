#!/usr/bin/env bash
# Builds the initramfs of the Linux check (scripts/atlantic-check.sh) and prints its path: busybox,
# Debian's virtio-iommu, atlantic and e1000e modules (decompressed, with their dependencies),
# iperf3 and ethtool with their shared libraries, and an /init that runs the guest's steps and
# reports each one as a DLCHECK line. Cached; rebuilt whenever any input file changes.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/build-atlantic-initramfs.sh [--modules DIR] [--force]

Builds ${DRIVERLAB_CACHE:-~/.cache/driverlab}/initramfs/dlcheck-KVER.cpio.gz (gzip'd newc)
and prints its path. KVER is the kernel the modules belong to; the archive only works with
that kernel (scripts/fetch-debian-kernel.sh prints it).
  --modules DIR  module tree to take modules from (default: scripts/fetch-debian-kernel.sh --modules)
  --force        rebuild even if the inputs did not change

Kernel command line parameters read by the guest's /init:
  dlcheck.nic=atlantic|e1000e  driver to load and check (default atlantic)
  dlcheck.ip=ADDR/LEN          the guest's address (default 10.77.0.2/24)
  dlcheck.peer=ADDR            the peer that runs `iperf3 -s` (default 10.77.0.1)
  dlcheck.duration=SECONDS     length of each iperf3 run (default 10)
  dlcheck.speed=MBITS          link speed the driver must report; 0 accepts any (default 10000)
  dlcheck.out=DEVICE           second channel for the DLCHECK lines, e.g. /dev/ttyS1
EOF
}

force=0
moddir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --modules) moddir="${2:?--modules needs a directory}"; shift ;;
        --force) force=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
. scripts/lib.sh
# kmod for modinfo, cpio to pack; the rest goes into the image.
apt_install busybox-static iperf3 ethtool cpio kmod xz-utils
[ -n "$moddir" ] || moddir=$(scripts/fetch-debian-kernel.sh --modules)
if [ ! -d "$moddir/kernel" ]; then
    echo "$moddir is not a module tree (no kernel/ below it); pass --modules DIR" >&2
    exit 1
fi
kver=$(basename "$moddir")
cache="${DRIVERLAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/driverlab}/initramfs"
out="$cache/dlcheck-$kver.cpio.gz"
mkdir -p "$cache"
staging=$(mktemp -d "$cache/.staging.XXXXXX")
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging"/{bin,dev,etc/dlcheck,lib/modules,proc,sys,tmp,run}

# --- Modules -----------------------------------------------------------------------------------
# Debian ships no modules.dep (depmod runs when the package is installed) and .ko.xz files that
# busybox insmod cannot read. So: index the tree by module name, follow `modinfo -F depends`
# ourselves, and store each module decompressed as /lib/modules/NAME.ko. Each group file lists
# a root module after its dependencies, in the order /init must insmod them.
declare -A modfile=() depends=()
while IFS= read -r -d '' f; do
    name=${f##*/}
    name=${name%.ko*}
    modfile[${name//-/_}]="$f"
done < <(find "$moddir/kernel" -name '*.ko*' -print0)

# Appends NAME and, before it, its dependencies to the group file $group_file (duplicates are
# removed afterwards). Each module is decompressed once, even if several groups need it.
stage_module() {
    local name="${1//-/_}" src dep
    if [ -z "${depends[$name]+set}" ]; then
        src="${modfile[$name]:-}"
        if [ -z "$src" ]; then
            if grep -q -e "/${name}.ko\$" -e "/${name//_/-}.ko\$" "$moddir/modules.builtin" 2>/dev/null; then
                return 0 # built into this kernel: nothing to load
            fi
            echo "module $name is neither in $moddir nor built in" >&2
            exit 1
        fi
        case "$src" in
            *.ko.xz) xz -dc "$src" ;;
            *.ko.zst) zstd -dcq "$src" ;;
            *.ko.gz) gzip -dc "$src" ;;
            *) cat "$src" ;;
        esac >"$staging/lib/modules/$name.ko"
        depends[$name]=$(modinfo -F depends "$staging/lib/modules/$name.ko")
    fi
    for dep in ${depends[$name]//,/ }; do
        stage_module "$dep"
    done
    echo "$name" >>"$group_file"
}
# One group per insmod phase of /init: the IOMMU first, so that the NIC is in an IOMMU group by
# the time its driver binds; then the NIC driver of the chosen mode.
for group in iommu:virtio_iommu atlantic:atlantic e1000e:e1000e; do
    group_file="$staging/etc/dlcheck/${group%%:*}.modules"
    : >"$group_file"
    stage_module "${group#*:}"
    # A dependency reached twice is listed twice; keep the first occurrence.
    awk '!seen[$0]++' "$group_file" >"$group_file.tmp" && mv "$group_file.tmp" "$group_file"
done

# --- Programs ----------------------------------------------------------------------------------
# Static busybox gives the shell and the tools; an applet symlink each, so /init needs no setup.
cp /bin/busybox "$staging/bin/busybox"
for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -s busybox "$staging/bin/$applet"
done
# iperf3 is dynamically linked, and ethtool is the only way to read the firmware version:
# atlantic logs neither the firmware version nor the MAC. Copy both with what ldd says they
# load, at the same paths (the loader is found at /lib64/ld-linux-x86-64.so.2).
copy_with_libs() {
    local bin="$1" lib
    cp "$bin" "$staging/bin/"
    for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
        cp -L --parents "$lib" "$staging/"
    done
}
copy_with_libs /usr/bin/iperf3
copy_with_libs /usr/sbin/ethtool
# The kernel opens /dev/console for /init's stdin/stdout before /init can mount devtmpfs.
as_root mknod -m 600 "$staging/dev/console" c 5 1

# --- /init -------------------------------------------------------------------------------------
cat >"$staging/init" <<'INIT'
#!/bin/sh
# /init of the Linux check's guest (busybox sh, PID 1), written by
# scripts/build-atlantic-initramfs.sh. Runs the check's steps once, then powers off.
#
# Each step prints "DLCHECK step=NAME begin", then one result line
#   DLCHECK step=NAME ok|fail|skip [reason=TEXT] [key=value ...] secs=S
# where values never contain spaces. The last line is "DLCHECK done ok" or
# "DLCHECK done fail failed=NAME,NAME". Lines go to the console and to dlcheck.out if given.
# Once a step fails the remaining network steps are skipped; unload and dmesg always run.

export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# iperf3 creates its stream buffers with mkstemp in /tmp.
mount -t tmpfs tmpfs /tmp

param() { # NAME DEFAULT: the value of dlcheck.NAME= on the kernel command line
    v=$2
    # shellcheck disable=SC2013  # the command line is one line of words
    for w in $(cat /proc/cmdline); do
        case "$w" in "dlcheck.$1="*) v=${w#*=} ;; esac
    done
    echo "$v"
}
NIC=$(param nic atlantic)
IP=$(param ip 10.77.0.2/24)
PEER=$(param peer 10.77.0.1)
DURATION=$(param duration 10)
SPEED=$(param speed 10000)
OUT=$(param out "")
# Kernel faults that fail the check; scripts/atlantic-check.sh greps the console log for the
# same expression (keep the two in step).
FAULTS='WARNING:|BUG:|Oops|general protection fault|Unable to handle|Call Trace|NETDEV WATCHDOG|soft lockup|hard LOCKUP|rcu.*stall|blocked for more than|page allocation failure|fault from EP|[Ii][Oo][Mm][Mm][Uu].*[^A-Za-z][Ff]ault|DMAR:.*[^A-Za-z][Ff]ault|AMD-Vi:.*([^A-Za-z][Ff]ault|Event)|swiotlb buffer is full|DMA-API'

if [ -n "$OUT" ] && ! stty -F "$OUT" raw -echo 2>/dev/null; then
    echo "dlcheck: cannot use $OUT as result channel; console only"
    OUT=""
fi
emit() {
    echo "DLCHECK $*"
    if [ -n "$OUT" ]; then echo "DLCHECK $*" >>"$OUT"; fi
}
san() { echo "$*" | tr -s ' \t\r\n' '____' | sed 's/_*$//' | cut -c1-200; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN { printf "%.2f", b - a }'; }

FAILED=""
STEP=""
T0=0
ok() { emit "step=$STEP ok $* secs=$(since "$T0")"; }
fail() { # REASON [key=value ...]
    r=$(san "$1"); shift
    FAILED="${FAILED:+$FAILED,}$STEP"
    emit "step=$STEP fail reason=$r $* secs=$(since "$T0")"
}
# run NAME FUNCTION [always]: a step; skipped after a failure unless "always".
run() {
    if [ -n "$FAILED" ] && [ "${3:-}" != always ]; then
        emit "step=$1 skip reason=earlier-failure"
        return
    fi
    STEP=$1
    T0=$(uptime_s)
    emit "step=$1 begin"
    "$2"
}
# wait_for SECONDS COMMAND...: polls every 0.2 s; true once COMMAND succeeds.
wait_for() {
    n=$(($1 * 5)); shift
    while [ "$n" -gt 0 ]; do
        "$@" 2>/dev/null && return 0
        usleep 200000
        n=$((n - 1))
    done
    return 1
}
# insmod every module of a group in order; returns false after reporting the failure.
load_group() {
    LOADED=""
    while read -r m; do
        [ -n "$m" ] || continue
        if ! grep -q "^$m " /proc/modules; then
            if ! msg=$(insmod "/lib/modules/$m.ko" 2>&1); then
                fail "insmod $m: $msg"
                return 1
            fi
        fi
        LOADED="${LOADED:+$LOADED,}$m"
    done <"/etc/dlcheck/$1.modules"
}

s_boot() {
    ok "kernel=$(uname -r) cpus=$(nproc) mem_kb=$(awk '/MemTotal/ { print $2 }' /proc/meminfo) nic=$NIC"
}

has_iommu() { [ -e "$(echo /sys/class/iommu/* | cut -d' ' -f1)" ]; }
s_iommu() {
    load_group iommu || return
    if ! wait_for 10 has_iommu; then
        fail "virtio-iommu loaded but no IOMMU registered (is -device virtio-iommu-pci there?)"
        return
    fi
    set -- /sys/class/iommu/*
    ok "modules=$LOADED iommu=${1##*/}"
}

s_load() {
    load_group "$NIC" || return
    ok "modules=$LOADED"
}

# The first network interface bound to the driver under test.
find_if() {
    for d in /sys/class/net/*; do
        [ -e "$d/device/driver" ] || continue
        if [ "$(basename "$(readlink "$d/device/driver")")" = "$NIC" ]; then
            IF=$(basename "$d")
            return 0
        fi
    done
    return 1
}
s_probe() {
    if ! wait_for 60 find_if; then
        fail "no network interface bound to $NIC" \
            "last_log=$(san "$(dmesg | grep -i "$NIC" | tail -n 1)")"
        return
    fi
    dev=$(readlink -f "/sys/class/net/$IF/device")
    PCI=$(basename "$dev")
    id="$(sed 's/^0x//' "$dev/vendor"):$(sed 's/^0x//' "$dev/device")"
    mac=$(cat "/sys/class/net/$IF/address")
    case "$(cat "/sys/class/net/$IF/addr_assign_type")" in
        0) macsrc=permanent ;; 1) macsrc=random ;; 2) macsrc=stolen ;; *) macsrc="set" ;;
    esac
    fw=$(ethtool -i "$IF" 2>/dev/null | sed -n 's/^firmware-version: *//p')
    facts="if=$IF pci=$PCI id=$id mac=$mac mac_source=$macsrc fw=$(san "${fw:-unknown}")"
    if [ "$macsrc" = random ]; then
        # atlantic logs "MAC is invalid, will use random." when the firmware's MAC is unusable.
        fail "driver fell back to a random MAC" "$facts"
        return
    fi
    ok "$facts"
}

s_iommu_group() {
    g=$(readlink "/sys/class/net/$IF/device/iommu_group")
    if [ -z "$g" ]; then
        fail "$PCI is in no IOMMU group: its DMA bypasses the virtio-iommu"
        return
    fi
    g=$(basename "$g")
    type=$(cat "/sys/kernel/iommu_groups/$g/type" 2>/dev/null || echo unknown)
    case "$type" in
        identity) fail "IOMMU group $g is identity-mapped: DMA is not translated" "group=$g type=$type" ;;
        *)
            set -- "/sys/kernel/iommu_groups/$g/devices"/*
            ok "group=$g type=$type devices=$#"
            ;;
    esac
}

carrier_up() { [ "$(cat "/sys/class/net/$IF/carrier")" = 1 ]; }
# Waits for the link after an ifup and checks the reported speed.
link_up_facts() {
    if ! wait_for 60 carrier_up; then
        fail "no carrier within 60 s of ifup" "operstate=$(cat "/sys/class/net/$IF/operstate")"
        return
    fi
    speed=$(cat "/sys/class/net/$IF/speed" 2>/dev/null || echo unknown)
    duplex=$(cat "/sys/class/net/$IF/duplex" 2>/dev/null || echo unknown)
    irqs=$(grep -c -e "$IF" -e "$NIC" -e "$PCI" /proc/interrupts)
    # What the driver said last about the interface, e.g. atlantic's "link change old 0 new 10000".
    said=$(dmesg | grep -e " $IF: " | tail -n 1 | sed 's/^\[[^]]*\] *//')
    facts="speed=$speed duplex=$duplex mtu=$(cat "/sys/class/net/$IF/mtu") irqs=$irqs driver_log=$(san "$said")"
    if [ "$SPEED" != 0 ] && [ "$speed" != "$SPEED" ]; then
        fail "link speed $speed, expected $SPEED" "$facts"
        return
    fi
    ok "$facts"
}
s_link_up() {
    if ! msg=$(ip addr add "$IP" dev "$IF" 2>&1 && ip link set "$IF" up 2>&1); then
        fail "ifup: $msg"
        return
    fi
    link_up_facts
}
s_ping_again() { s_ping; }

s_link_down() {
    if ! msg=$(ip link set "$IF" down 2>&1); then
        fail "ifdown: $msg"
        return
    fi
    state=$(cat "/sys/class/net/$IF/operstate")
    if [ "$state" != down ]; then
        fail "operstate $state after ifdown"
        return
    fi
    ok "operstate=$state"
}
s_link_up_again() {
    if ! msg=$(ip link set "$IF" up 2>&1); then
        fail "ifup: $msg"
        return
    fi
    link_up_facts
}

s_ping() {
    msg=$(ping -c 3 -w 30 "$PEER" 2>&1)
    echo "$msg"
    sent=$(echo "$msg" | sed -n 's/^\([0-9]*\) packets transmitted.*/\1/p')
    got=$(echo "$msg" | sed -n 's/.* \([0-9]*\) packets received.*/\1/p')
    rtt=$(echo "$msg" | sed -n 's|^round-trip min/avg/max = [^/]*/\([^/]*\)/.*|\1|p')
    if [ -z "$got" ] || [ "$got" = 0 ] || [ "$got" != "$sent" ]; then
        fail "ping $PEER: ${got:-0} of ${sent:-0} replies" "sent=${sent:-0} received=${got:-0}"
        return
    fi
    ok "peer=$PEER sent=$sent received=$got rtt_avg_ms=${rtt:-unknown}"
}

# iperf3 against the peer; $1 is tx (guest sends) or rx (guest receives, iperf3 -R).
iperf() {
    rev=""
    [ "$1" = rx ] && rev=-R
    # busybox timeout: iperf3 can wait forever on a stalled connection.
    msg=$(timeout $((DURATION + 60)) iperf3 -c "$PEER" -t "$DURATION" -f m --connect-timeout 10000 $rev 2>&1)
    rc=$?
    echo "$msg"
    # Summary lines: "[  5]   0.00-10.00  sec  112 MBytes  94.0 Mbits/sec  0  sender"
    rate() { echo "$msg" | awk -v w="$1" '$NF == w { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") r = $(i - 1) } END { print r }'; }
    recv=$(rate receiver)
    send=$(rate sender)
    retr=$(echo "$msg" | awk '$NF == "sender" { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec" && $(i + 1) ~ /^[0-9]+$/) r = $(i + 1) } END { print r }')
    if [ "$rc" != 0 ] || [ -z "$recv" ]; then
        fail "iperf3 exit $rc: $(echo "$msg" | grep -v '^ *$' | tail -n 1)"
        return
    fi
    if ! awk -v r="$recv" 'BEGIN { exit !(r > 0) }'; then
        fail "iperf3 moved no data" "mbps=$recv"
        return
    fi
    ok "mbps=$recv sender_mbps=${send:-unknown} retransmits=${retr:-unknown} duration=$DURATION"
}
s_iperf_tx() { iperf tx; }
s_iperf_rx() { iperf rx; }

s_counters() {
    facts=""
    for c in rx_packets tx_packets rx_errors tx_errors rx_dropped tx_dropped; do
        facts="$facts $c=$(cat "/sys/class/net/$IF/statistics/$c")"
    done
    ok "${facts# }"
}

s_unload() {
    # With the interface up: rmmod then has to close it and remove the device, both paths.
    if ! msg=$(rmmod "$NIC" 2>&1); then
        fail "rmmod $NIC: $msg"
        return
    fi
    if grep -q "^$NIC " /proc/modules; then
        fail "$NIC still listed in /proc/modules after rmmod"
        return
    fi
    if [ -n "${IF:-}" ] && [ -e "/sys/class/net/$IF" ]; then
        fail "$IF still exists after rmmod $NIC"
        return
    fi
    ok "module=$NIC"
}

s_dmesg() {
    n=$(dmesg | grep -E -c "$FAULTS")
    errs=$(dmesg -r | grep -c '^<[0-3]>')
    if [ "$n" != 0 ]; then
        fail "kernel reported faults" "count=$n first=$(san "$(dmesg | grep -E "$FAULTS" | head -n 1)")"
        return
    fi
    ok "faults=0 err_lines=$errs"
}

echo "dlcheck: nic=$NIC ip=$IP peer=$PEER duration=$DURATION speed=$SPEED out=${OUT:-console}"
run boot s_boot
run iommu s_iommu
run load s_load
run probe s_probe
run iommu-group s_iommu_group
run link-up s_link_up
run ping s_ping
run iperf-tx s_iperf_tx
run iperf-rx s_iperf_rx
run link-down s_link_down
run link-up-again s_link_up_again
run ping-again s_ping_again
[ -n "${IF:-}" ] && run counters s_counters always
if grep -q "^$NIC " /proc/modules; then run unload s_unload always; fi
run dmesg s_dmesg always
if [ -z "$FAILED" ]; then emit "done ok"; else emit "done fail failed=$FAILED"; fi

# The whole kernel log, for the record (the console shows only warnings and worse live).
echo "==== dlcheck dmesg begin ===="
dmesg
echo "==== dlcheck dmesg end ===="
# Let the UARTs drain before the power goes.
sleep 1
poweroff -f
INIT
chmod 755 "$staging/init"

# --- Pack, unless an identical image exists --------------------------------------------------
# The key is the content of everything staged (modules, programs, libraries, /init, links).
# shellcheck disable=SC2016  # the inner sh expands these
key=$(cd "$staging" && find . \( -type f -o -type l \) -print0 | sort -z |
    xargs -0 sh -c 'for f; do
        if [ -L "$f" ]; then echo "link $f $(readlink "$f")"; else sha256sum "$f"; fi
    done' sh | sha256sum | cut -d' ' -f1)
if [ "$force" = 0 ] && [ -f "$out" ] && [ "$(cat "$out.key" 2>/dev/null)" = "$key" ]; then
    echo "$out"
    exit 0
fi
echo "packing $out" >&2
(cd "$staging" && find . -print0 | LC_ALL=C sort -z |
    cpio --quiet --null -o -H newc -R 0:0 --reproducible) | gzip -9n >"$out.tmp"
mv "$out.tmp" "$out"
echo "$key" >"$out.key"
echo "$out"
