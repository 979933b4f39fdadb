#!/usr/bin/env bash
# The hvtrace package as a sysadmin runs it: installed with dpkg into a fresh
# Debian tree, booted with systemd as PID 1 in a systemd-nspawn container,
# `systemctl enable --now hvtraced`, then a guest booted by a member of
# hvtrace-admin, crashed, and its capture read by a member of hvtrace.
# Everything the unit sets up (user, groups, directories, environment,
# sandbox, the VM's own scope, reload, stop) is the real systemd's doing.
#
#   tests/service/service_test.sh PACKAGES_DIR GUEST_DIR
#
# PACKAGES_DIR holds hvtrace_*.deb (scripts/build-packages.sh); GUEST_DIR is
# build/guest (qemu-scripts/build-guest.sh: 6.12/vmlinuz, 6.12/initrd.img).
# Needs root and systemd-nspawn (systemd-container). Exit 77: skipped.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PACKAGES=${1:?usage: service_test.sh PACKAGES_DIR GUEST_DIR}
GUEST=$(cd "${2:?usage: service_test.sh PACKAGES_DIR GUEST_DIR}" && pwd)

fail() { echo "service_test: FAIL: $*" >&2; exit 1; }
log() { echo "service_test: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "skipped: needs root"; exit 77; }
command -v systemd-nspawn >/dev/null || { log "skipped: no systemd-nspawn"; exit 77; }
deb=$(ls "$PACKAGES"/hvtrace_*.deb 2>/dev/null | tail -n 1)
[ -n "$deb" ] || fail "no hvtrace_*.deb in $PACKAGES (run scripts/build-packages.sh)"
[ -f "$GUEST/6.12/vmlinuz" ] || fail "no guest kernel in $GUEST/6.12"

WORK=$(mktemp -d /var/tmp/hvtrace-service.XXXXXX)
TREE=$WORK/root
NSPAWN_PID=
cleanup() {
  status=$?
  if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
    [ $status -eq 0 ] || { log "container journal (hvtraced):"; inside journalctl -u hvtraced --no-pager -n 40 >&2 || true; }
    kill -TERM "$NSPAWN_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$NSPAWN_PID" 2>/dev/null || true
  fi
  [ $status -eq 0 ] || { log "container console:"; tail -n 20 "$WORK/console.log" >&2 || true; }
  rm -rf "$WORK"
  exit $status
}
trap cleanup EXIT

status=0
tree=$("$ROOT/tests/packaging/build-pkgroot.sh" "$WORK/root.tar" "$deb") || status=$?
[ $status -ne 75 ] || { log "skipped: Debian's archive is unreachable and no root is cached"; exit 77; }
[ $status -eq 0 ] || fail "tests/packaging/build-pkgroot.sh failed ($status)"
log "tree: $tree"
mkdir "$TREE" && tar -C "$TREE" -xf "$WORK/root.tar"

log "installing $(basename "$deb") with dpkg"
cp "$deb" "$TREE/tmp/"
chroot "$TREE" dpkg -i "/tmp/$(basename "$deb")" >"$WORK/dpkg.log" 2>&1 ||
  { cat "$WORK/dpkg.log" >&2; fail "dpkg -i $(basename "$deb")"; }
chroot "$TREE" useradd -m -G hvtrace-admin alice
chroot "$TREE" useradd -m -G hvtrace bob
# What an admin edits in /etc/hvtrace/hvtraced.conf on a host like this one:
# no libvirtd in the container, TCG (this machine's KVM fails guests), the
# project's harvest initramfs for the formats.
CONF=$TREE/etc/hvtrace/hvtraced.conf
set_key() {  # set_key KEY VALUE: the config refuses repeated keys
  sed -i "/^$1 *=/d" "$CONF"
  echo "$1 = $2" >>"$CONF"
}
set_key libvirt_uri ""
set_key accel tcg
set_key harvest_initrd /guest/6.12/initrd.img

log "booting systemd in the container"
systemd-nspawn -q -D "$TREE" --boot --register=no --keep-unit --bind-ro="$GUEST:/guest" \
  >"$WORK/console.log" 2>&1 &
NSPAWN_PID=$!
LEADER=
for _ in $(seq 300); do
  LEADER=$(pgrep -P "$NSPAWN_PID" -x systemd || true)
  [ -n "$LEADER" ] && break
  sleep 0.1
done
[ -n "$LEADER" ] || fail "systemd did not start in the container"
inside() { nsenter -t "$LEADER" -a "$@"; }
as() { local user=$1; shift; inside runuser -u "$user" -- "$@"; }
for _ in $(seq 300); do inside test -S /run/systemd/private && break; sleep 0.1; done
state=$(inside systemctl is-system-running --wait || true)
[ "$state" = running ] || { inside systemctl --failed --no-pager >&2; fail "container is $state"; }

log "systemctl enable --now hvtraced"
inside systemctl enable --now hvtraced
[ "$(inside systemctl is-active hvtraced)" = active ] || fail "hvtraced is not active"
inside journalctl -u hvtraced --no-pager -o cat | grep -q listening || fail "no 'listening' in the journal"
main_pid=$(inside systemctl show -p MainPID --value hvtraced)

log "observer bob looks, admin alice boots"
as bob hvtrace ping >/dev/null || fail "bob (hvtrace) cannot reach the daemon"
if as bob hvtrace boot nope --kernel /guest/6.12/vmlinuz --initrd /guest/6.12/initrd.img \
  >"$WORK/bob-boot.txt" 2>&1; then fail "bob (observer) could boot a VM"; fi
as alice hvtrace boot demo --kernel /guest/6.12/vmlinuz --initrd /guest/6.12/initrd.img \
  --trace-size 16 >"$WORK/boot.txt" 2>&1 || { cat "$WORK/boot.txt" >&2; fail "alice's boot"; }
scope=hvtrace-vm-demo.scope
[ "$(inside systemctl is-active $scope)" = active ] || fail "$scope is not active"
# QEMU, seen through the container's own /proc: in the scope, sandboxed.
qemu_cmdline=
for p in /proc/"$LEADER"/root/proc/[0-9]*; do
  cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null || true)
  # The VM, not the formats harvest guest (its kernel path names demo too).
  case "$cmd" in *qemu-system*/run/hvtrace/demo.qmp*) ;; *) continue ;; esac
  grep -q "/$scope\$" "$p/cgroup" || fail "QEMU ($p) is not in $scope: $(cat "$p/cgroup")"
  qemu_cmdline=$cmd
done
[ -n "$qemu_cmdline" ] || fail "no QEMU process for demo in the container"
grep -q -- '-sandbox on' <<<"$qemu_cmdline" || fail "QEMU runs without -sandbox on: $qemu_cmdline"

log "waiting for the daemon's formats harvest (it decodes the capture with them)"
for _ in $(seq 1200); do
  journal=$(inside journalctl -u hvtraced --no-pager -o cat)
  grep -q 'harvested in' <<<"$journal" && break
  grep -q 'harvest failed' <<<"$journal" && fail "the harvest failed: $(grep 'harvest failed' <<<"$journal")"
  sleep 0.2
done
grep -q 'harvested in' <<<"$journal" || fail "no harvest after 240 s"

log "markers in the guest, then a panic"
python3 - "/proc/$LEADER/root/run/hvtrace/demo.console" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(1)
buf = b""
def wait(needle, timeout):
    global buf
    end = time.time() + timeout
    while needle not in buf:
        if time.time() > end: sys.exit("service_test: guest console never showed %r" % needle)
        try: buf += s.recv(65536)
        except socket.timeout: pass
# The guest may have printed its ready line before this client connected
# (the harvest ran first): ask its shell for a prompt until one shows.
end = time.time() + 240
while b"hvtrace-guest# " not in buf and b"HVTRACE-GUEST-READY" not in buf:
    if time.time() > end: sys.exit("service_test: the guest's shell never answered")
    s.sendall(b"\n")
    try: buf += s.recv(65536)
    except socket.timeout: pass
m = "/sys/kernel/tracing/instances/boot_map/trace_marker"
for ch in ("echo service-marker-before-panic > %s; echo c > /proc/sysrq-trigger\n" % m).encode():
    s.sendall(bytes([ch]))
wait(b"Kernel panic", 120)
PY

capture=
for _ in $(seq 300); do
  capture=$(as bob hvtrace captures demo --json | python3 -c 'import json,sys
c=[x for x in json.load(sys.stdin)["captures"] if x.get("trigger")=="panic"]
print(c[-1]["id"] if c else "")')
  [ -n "$capture" ] && break
  sleep 0.2
done
[ -n "$capture" ] || fail "no panic capture"
as bob hvtrace show "/var/lib/hvtrace/vms/demo/captures/$capture" >"$WORK/show.txt" ||
  fail "bob cannot read the capture"
grep -q 'service-marker-before-panic' "$WORK/show.txt" || fail "the marker is not in the capture"
log "capture $capture: $(wc -l <"$WORK/show.txt") lines, marker present, read by bob"

log "journal priorities"
inside journalctl -u hvtraced --no-pager -o cat -p notice | grep -q "$capture" ||
  fail "the capture is not logged at notice or above"
if inside journalctl -u hvtraced --no-pager -o cat -p warning | grep -q listening; then
  fail "'listening' logged as a warning"
fi

log "systemctl reload re-reads the config"
set_key log_level debug
inside systemctl reload hvtraced
[ "$(inside systemctl is-active hvtraced)" = active ] || fail "hvtraced died on reload"
[ "$(inside systemctl show -p MainPID --value hvtraced)" = "$main_pid" ] || fail "reload restarted hvtraced"

log "systemctl stop with vm_on_shutdown = keep leaves the VM's scope"
inside systemctl stop hvtraced
[ "$(inside systemctl is-active $scope)" = active ] || fail "stopping hvtraced stopped $scope"
inside systemctl start hvtraced
as bob hvtrace list | grep -q demo || fail "the restarted daemon did not re-adopt demo"
set_key vm_on_shutdown stop
inside systemctl reload hvtraced
inside systemctl stop hvtraced
for _ in $(seq 100); do
  [ "$(inside systemctl is-active $scope || true)" = active ] || break
  sleep 0.1
done
[ "$(inside systemctl is-active $scope || true)" != active ] || fail "vm_on_shutdown = stop left $scope"
log "PASS"
