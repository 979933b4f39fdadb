#!/usr/bin/env bash
# Scale benchmark: one hvtraced watching many real QEMU VMs, plus a few real
# guests panicking at the same moment (issue 16, items 4 and 5).
#
#   bench/scale.sh [BUILD_DIR]        (root; VMS=100 PANICS=3 IDLE_S=30 by default)
#
# - VMS paused QEMUs (-S: no guest runs, so 100 fit a 2-core machine), each
#   with a host-backed boot range and its own QMP socket, started from the
#   argv `hvtrace qemu-args` prints and watched through `hvtrace adopt`, the
#   way a user hands hvtraced a QEMU of their own. -m 256M, a TRACE_MIB (4)
#   range: an untouched guest costs QEMU little and the host nothing more.
# - PANICS real TCG guests (the e2e 6.12 image) booted through `hvtrace
#   boot` with a PANIC_TRACE_MIB (16) range; once all are up, each gets
#   `echo c > /proc/sysrq-trigger` on its console at the same moment.
#
# Prints hvtraced's RSS (anon/file/shmem) with no VM, after the first VM and
# with all of them, the per-VM cost in KiB, the copy buffers (`ping`:
# one set per capture worker), daemon CPU while idle over IDLE_S seconds
# (with no VM first, the floor, then with every VM), `hvtrace list`
# latency against `hvtrace ping` (the same round trip without the VMs), and
# each panic's capture times from its manifest. What each QEMU costs the
# machine is printed first. Nothing here asserts a timing; it fails only
# when a VM is not listed or a panic is not captured.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
BIN=$BUILD/bin
VMS=${VMS:-100}
PANICS=${PANICS:-3}
IDLE_S=${IDLE_S:-30}
TRACE_MIB=${TRACE_MIB:-4}
PANIC_TRACE_MIB=${PANIC_TRACE_MIB:-16}
LIST_RUNS=${LIST_RUNS:-10}

[ "$(id -u)" = 0 ] || { echo "scale: run as root (hvtraced boots and adopts QEMUs)" >&2; exit 1; }
for b in hvtraced hvtrace; do
  [ -x "$BIN/$b" ] || { echo "scale: $BIN/$b not built" >&2; exit 1; }
done
for c in qemu-system-x86_64 socat jq; do
  command -v "$c" >/dev/null || { echo "scale: $c not installed" >&2; exit 1; }
done
GUEST=$ROOT/build/guest/6.12
[ -r "$GUEST/vmlinuz" ] || "$ROOT/qemu-scripts/build-guest.sh" --kernel 6.12 >&2

D=$(mktemp -d /tmp/hvs-XXXX)  # Short: socket paths have 107 bytes.
mkdir -p "$D/state" "$D/run/mem"
chmod 700 "$D/run/mem"
SOCK=$D/run/hvtraced.sock
QPIDS=()
DPID=
cleanup() {
  # Only what this script started: the daemon (which stops the guests it
  # booted: vm_on_shutdown = stop) and the QEMUs it launched, by pid.
  [ -n "$DPID" ] && kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
  for p in "${QPIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${QPIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$D"
}
trap cleanup EXIT

hv() { "$BIN/hvtrace" "$@" --socket "$SOCK"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# "RSS ANON FILE SHMEM" of hvtraced, KiB.
mem() {
  awk '/^VmRSS/{r=$2} /^RssAnon/{a=$2} /^RssFile/{f=$2} /^RssShmem/{s=$2}
       END{print r, a, f, s}' "/proc/$DPID/status"
}
print_mem() {  # LABEL
  read -r r a f s < <(mem)
  printf '%-28s RSS %7d KiB (anon %7d, file %6d, shmem %5d)\n' "$1" "$r" "$a" "$f" "$s"
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$DPID/stat"; }
idle_cpu() {  # LABEL: daemon CPU over IDLE_S seconds, % of one core
  local t0 t1 hz
  hz=$(getconf CLK_TCK)
  t0=$(cpu_ticks)
  sleep "$IDLE_S"
  t1=$(cpu_ticks)
  awk -v d=$((t1 - t0)) -v hz="$hz" -v s="$IDLE_S" -v l="$1" \
    'BEGIN{printf "%-28s %.2f%% of a core (%d ticks in %d s)\n", l, 100*d/hz/s, d, s}'
}
median() { sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }
latency() {  # ARGS...: median/max ms of LIST_RUNS runs of `hvtrace ARGS`
  local i t0 ts=()
  for ((i = 0; i < LIST_RUNS; i++)); do
    t0=$(date +%s%N)
    hv "$@" >/dev/null
    ts+=($((($(date +%s%N) - t0) / 1000)))
  done
  printf '%s\n' "${ts[@]}" | median
}

echo "# scale: $(date -u '+%Y-%m-%d %H:%M UTC'); $(uptime | sed 's/.*load/load/')"
echo "# $VMS paused QEMUs (-m 256M, ${TRACE_MIB} MiB range) + $PANICS TCG guests (${PANIC_TRACE_MIB} MiB range) panicking together"
printf 'accel = tcg\nvm_on_shutdown = stop\nlog_level = warning\n' >"$D/hvtraced.conf"
"$BIN/hvtraced" --config "$D/hvtraced.conf" --state-dir "$D/state" --run-dir "$D/run" \
  2>"$D/hvtraced.log" &
DPID=$!
for _ in $(seq 100); do hv ping >/dev/null 2>&1 && break; sleep 0.1; done
hv ping >/dev/null
sleep 1
print_mem "no VM:"
idle_cpu "idle CPU, no VM:"

# One paused QEMU, adopted; its argv is what `hvtrace qemu-args` prints.
start_paused() {  # NAME
  local j region pid
  j=$("$BIN/hvtrace" qemu-args "$1" --kernel "$GUEST/vmlinuz" --memory 256 --cpus 1 \
    --trace-size "$TRACE_MIB" --accel tcg --run-dir "$D/run" --json)
  region=$(jq -r .boot_region <<<"$j")
  mapfile -t argv < <(jq -r '.argv[]' <<<"$j")
  "${argv[@]}" -S </dev/null >"$D/run/$1.qemu.log" 2>&1 &
  pid=$!
  QPIDS+=("$pid")
  # QEMU makes its QMP socket before the memory backend's file.
  for _ in $(seq 200); do [ -S "$D/run/$1.qmp" ] && [ -f "${region%@*}" ] && break; sleep 0.05; done
  hv adopt "$1" --qmp "$D/run/$1.qmp" --boot-region "$region" >/dev/null
}
avail_kib() { awk '/^MemAvailable/{print $2}' /proc/meminfo; }
AVAIL0=$(avail_kib)
start_paused v1
sleep 1
read -r RSS1 _ < <(mem)
print_mem "1 VM:"
QEMU1=$(awk '/^VmRSS/{print $2}' "/proc/${QPIDS[0]}/status")
echo "one paused QEMU: RSS $QEMU1 KiB; $VMS of them need about $((QEMU1 * VMS / 1024)) MiB of $(($(avail_kib) / 1024)) MiB available"
T0=$(now_ms)
for i in $(seq 2 "$VMS"); do start_paused "v$i"; done
echo "started and adopted $((VMS - 1)) more in $(($(now_ms) - T0)) ms"
sleep 2
read -r RSSN _ < <(mem)
print_mem "$VMS VMs:"
awk -v a="$RSS1" -v b="$RSSN" -v n="$VMS" -v r="$TRACE_MIB" \
  'BEGIN{k=(b-a)/(n-1); printf "per idle VM: %.0f KiB (its range: %d KiB, ratio %.4f)\n", k, r*1024, k/(r*1024)}'
QRSS=0
for p in "${QPIDS[@]}"; do QRSS=$((QRSS + $(awk '/^VmRSS/{print $2}' "/proc/$p/status"))); done
echo "the $VMS QEMUs: RSS $((QRSS / 1024)) MiB in all; MemAvailable went down $(((AVAIL0 - $(avail_kib)) / 1024)) MiB"
echo "hvtraced fds: $(ls "/proc/$DPID/fd" | wc -l), threads: $(ls "/proc/$DPID/task" | wc -l)"

# The guests that will panic, booted together.
POOL0=$(hv ping --json | jq .copy_buffers.bytes)
read -r RSSB _ < <(mem)
BOOTS=()
for i in $(seq "$PANICS"); do
  hv boot "p$i" --kernel "$GUEST/vmlinuz" --initrd "$GUEST/initrd.img" \
    --trace-size "$PANIC_TRACE_MIB" --accel tcg --json >"$D/p$i.boot.json" &
  BOOTS+=($!)
done
for p in "${BOOTS[@]}"; do wait "$p"; done
T0=$(now_ms)
for i in $(seq "$PANICS"); do
  log=$(jq -r .console_log "$D/p$i.boot.json")
  until grep -q HVTRACE-GUEST-READY "$log" 2>/dev/null; do
    [ $(($(now_ms) - T0)) -lt 300000 ] || { echo "scale: p$i did not come up" >&2; exit 1; }
    sleep 1
  done
done
echo "$PANICS guests up $(($(now_ms) - T0)) ms after their boot replies"
sleep 2
POOL1=$(hv ping --json | jq .copy_buffers.bytes)
read -r RSSG _ < <(mem)
print_mem "$VMS VMs + $PANICS guests:"
awk -v a="$RSSB" -v b="$RSSG" -v n="$PANICS" -v p=$(((POOL1 - POOL0) / 1024)) \
  'BEGIN{printf "per booted guest: %.0f KiB (copy buffers grew %d KiB for its larger range)\n", (b-a-p)/n, p}'
echo "copy buffers: $(hv ping --json | jq -c .copy_buffers)"
idle_cpu "idle CPU, $((VMS + PANICS)) VMs:"

# `list` against `ping`: the same connection and framing, no VM in it.
LISTED=$(hv list --json | jq '.vms | length')
[ "$LISTED" = $((VMS + PANICS)) ] || { echo "scale: list shows $LISTED VMs, not $((VMS + PANICS))" >&2; exit 1; }
PING_US=$(latency ping)
LIST_US=$(latency list)
LISTJ_US=$(latency list --json)
awk -v p="$PING_US" -v l="$LIST_US" -v j="$LISTJ_US" -v n="$LISTED" -v r="$LIST_RUNS" \
  'BEGIN{printf "hvtrace list (%d VMs): %.1f ms, --json %.1f ms; hvtrace ping %.1f ms (median of %d; list/ping %.2f)\n", n, l/1000, j/1000, p/1000, r, l/p}'

# All panic at once: the commands go out together on the consoles.
CRASHES=()
for i in $(seq "$PANICS"); do
  printf 'echo c > /proc/sysrq-trigger\n' |
    socat -t 2 - "UNIX-CONNECT:$(jq -r .console_socket "$D/p$i.boot.json")" >/dev/null &
  CRASHES+=($!)
done
for p in "${CRASHES[@]}"; do wait "$p"; done
T0=$(now_ms)
for i in $(seq "$PANICS"); do
  dir=$D/state/vms/p$i/captures
  until m=$(ls "$dir"/*/manifest.json 2>/dev/null | head -1) && [ -n "$m" ] &&
    [ "$(jq -r .trigger "$m")" = panic ]; do
    [ $(($(now_ms) - T0)) -lt 120000 ] || { echo "scale: no panic capture for p$i" >&2; exit 1; }
    sleep 0.2
  done
  jq -r --arg vm "p$i" '.extra.timing_ms as $t | "panic \($vm): region.bin durable \($t.trigger_to_region_durable | . * 10 | round / 10) ms (copy \($t.copy | . * 10 | round / 10) ms), decoded \($t.trigger_to_decoded | . * 10 | round / 10) ms, \(.totals.events) events"' "$m"
done
print_mem "after the panics:"
echo "copy buffers: $(hv ping --json | jq -c .copy_buffers)"
