#!/usr/bin/env bash
# hvtrace's main job, end to end, on a fresh machine (as root):
# install dependencies, build, build the guest image, start hvtraced (private
# state under build/demo), boot a demo guest whose kernel writes its ring
# buffer into host memory from early boot, run a little workload with trace
# markers, crash the guest, wait for hvtraced's capture, and print the tail of
# the captured trace (ending with the guest's last events before the panic)
# and the panic-to-capture time. Everything it started is stopped on exit.
#
#   scripts/demo.sh [--no-deps] [--accel auto|tcg|kvm]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${HVTRACE_BUILD_DIR:-$ROOT/build}
DEMO=$BUILD/demo
accel=auto
deps=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-deps) deps=0; shift ;;
    --accel) accel=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

step() { printf '\n== %s\n' "$*"; }
daemon_pid=
cleanup() {
  status=$?
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    # The demo's config says vm_on_shutdown = stop: SIGTERM makes hvtraced
    # quit the guest it booted (QEMUs it boots outlive it otherwise).
    kill -TERM "$daemon_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon_pid" 2>/dev/null || true
  fi
  # If hvtraced could not stop it (killed above, or crashed), end the demo's
  # QEMU by the pid it recorded, after checking that pid still is that QEMU.
  qemu_pid=$(sed -n 's/^ *"pid": \([0-9][0-9]*\).*/\1/p' "$DEMO/state/vms/demo/qmp_vm.json" 2>/dev/null | head -n 1)
  if [ -n "$qemu_pid" ] && [ -r "/proc/$qemu_pid/cmdline" ] &&
    tr '\0' ' ' 2>/dev/null <"/proc/$qemu_pid/cmdline" | grep -q "$DEMO/run/demo.qmp"; then
    kill -KILL "$qemu_pid" 2>/dev/null || true
  fi
  rm -f /dev/shm/hvtrace-demo
  [ $status -eq 0 ] || { echo "demo: failed (exit $status); logs in $DEMO" >&2; tail -n 20 "$DEMO/hvtraced.log" 2>/dev/null >&2 || true; }
  exit $status
}
trap cleanup EXIT INT TERM

if [ $deps = 1 ]; then step "installing dependencies"; "$ROOT/scripts/install-deps.sh"; fi
step "building hvtrace"
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j2 --target hvtrace hvtraced
HVTRACE=$BUILD/bin/hvtrace
step "building the guest image (cached)"
line=$("$ROOT/qemu-scripts/build-guest.sh" --kernel 6.12 | grep '^GUEST 6.12 ')
kernel=$(sed -n 's/.* KERNEL=\([^ ]*\).*/\1/p' <<<"$line")
initrd=$(sed -n 's/.* INITRD=\([^ ]*\).*/\1/p' <<<"$line")

# One formats cache for the CLI (which harvests the kernel's event formats
# before booting) and the daemon (which decodes its captures with them).
export HVTRACE_CACHE_DIR=${HVTRACE_CACHE_DIR:-${HOME:-/root}/.cache/hvtrace}

step "starting hvtraced (state in $DEMO/state)"
rm -rf "$DEMO"; mkdir -p "$DEMO"
printf 'socket_group =\naccel = %s\nvm_on_shutdown = stop\n' "$accel" >"$DEMO/hvtraced.conf"
export HVTRACE_SOCKET=$DEMO/run/hvtraced.sock
"$BUILD/bin/hvtraced" --config "$DEMO/hvtraced.conf" --state-dir "$DEMO/state" --run-dir "$DEMO/run" \
  2>"$DEMO/hvtraced.log" &
daemon_pid=$!
for _ in $(seq 100); do "$HVTRACE" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$HVTRACE" ping

step "booting the demo guest with a 16 MiB boot trace buffer"
"$HVTRACE" boot demo --kernel "$kernel" --initrd "$initrd" --trace-size 16 --accel "$accel" | tee "$DEMO/boot.txt"
console=$DEMO/run/demo.console

step "workload + markers in the guest, then a kernel panic (sysrq c)"
python3 - "$console" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(1)
buf = b""
def wait(needle, timeout):
    global buf
    end = time.time() + timeout
    while needle not in buf:
        if time.time() > end: sys.exit("demo: guest console never showed %r" % needle)
        try: buf += s.recv(65536)
        except socket.timeout: pass
wait(b"HVTRACE-GUEST-READY", 180)
m = "/sys/kernel/tracing/instances/boot_map/trace_marker"
s.sendall(("for i in 1 2 3 4 5; do echo demo-step-$i > %s; ls -R /sys/class > /dev/null; done; echo __DEMO_DONE\n" % m).encode())
wait(b"\n__DEMO_DONE", 120)
buf = buf[buf.index(b"\n__DEMO_DONE"):]
wait(b"hvtrace-guest# ", 60)
print("guest: 5 markers written; crashing it now")
# Keep the socket open until the panic shows: QEMU drops input a closed
# console client had not delivered yet.
for ch in ("echo demo-last-words-before-panic > %s; echo c > /proc/sysrq-trigger\n" % m).encode():
    s.sendall(bytes([ch]))
wait(b"Kernel panic", 120)
PY

step "waiting for hvtraced's capture"
capture=
for _ in $(seq 300); do
  capture=$("$HVTRACE" captures demo --json | python3 -c 'import json,sys
c=[x for x in json.load(sys.stdin)["captures"] if x.get("trigger")=="panic"]
print(c[-1]["id"] if c else "")')
  [ -n "$capture" ] && break
  sleep 0.2
done
[ -n "$capture" ] || { echo "demo: no panic capture after 60 s" >&2; exit 1; }
dir=$DEMO/state/vms/demo/captures/$capture
"$HVTRACE" captures demo

step "why the guest died: the capture's crash summary (from its kernel log)"
"$HVTRACE" show "$dir" >"$DEMO/capture.txt"
# The summary is the '# crash' lines before the first boot's '# capture' header.
sed -n '/^# capture /q; p' "$DEMO/capture.txt"

step "the captured trace, decoded: its tail (the guest's last events before the panic)"
# Events only: the summary's '#' lines quote the panicking CPU's last events,
# markers among them, and would count twice.
grep -v '^#' "$DEMO/capture.txt" |
  grep -c -E 'tracing_mark_write: demo-(step-[0-9]|last-words-before-panic)$' |
  sed 's/^/markers in the capture: /; s/$/ of 6 written/'
tail -n 25 "$DEMO/capture.txt"

step "timing"
"$HVTRACE" status demo --json | python3 -c 'import json,sys
s=json.load(sys.stdin); c=s["last_capture"]
print("panic -> capture committed (decoded, manifest written): %.1f ms (capture %s)" % (c["trigger_to_disk_ms"], c["id"]))'
python3 -c 'import json,sys
m=json.load(open(sys.argv[1])); t=m["extra"]["timing_ms"]; f=m["extra"]["formats"]
print("panic -> region.bin durable: %.1f ms (16 MiB: copy %.1f ms, write+fsync %.1f ms)" % (t["trigger_to_region_durable"], t["copy"], t["region_write_fsync"]))
print("panic -> decoded trace.dat: %.1f ms (formats %s, decode %.1f ms, trace.dat write %.1f ms)" % (t["trigger_to_decoded"], f["state"], t["decode"], t["trace_dat_write"]))
print("events in the buffer: %s over %d CPUs, %d boot(s)" % (m["totals"]["events"], len(m["cpus"]), len(m["extra"]["boots"])))' "$dir/manifest.json"
echo "capture directory: $dir (trace-cmd report -i $dir/boot-0.trace.dat)"
