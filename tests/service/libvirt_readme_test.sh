#!/usr/bin/env bash
# The README's libvirt quick start ("Quick start: trace an existing libvirt
# VM"), run as written: a fresh Debian tree booted with systemd as PID 1 in a
# systemd-nspawn container of the release the packages were built for, with
# that release's libvirt as Debian sets it up (its default qemu.conf: QEMU as
# libvirt-qemu; Debian 12: libvirt 9.0's libvirtd, Debian 13: libvirt 11's,
# see below) and QEMU (7.2, 10.0), and the hvtrace package installed, a
# domain web1 booted from a Debian test image, and a host user who is
# only in hvtrace-admin (and may sudo, as the README's virsh lines need)
# typing the README's host lines; its guest lines are typed into web1's root
# shell.
#
#   tests/service/libvirt_readme_test.sh PACKAGES_DIR IMAGE_DIR
#
# PACKAGES_DIR holds the .debs (scripts/build-packages.sh) and, when they
# were built with --suite, the file `suite` naming their release (bookworm
# without it): the container's release. IMAGE_DIR is build/guest/debian12 or
# debian13 (qemu-scripts/build-debian-image.sh --agent-deb: the agent
# package installed and its .deb in /root, the copy the README's guest step
# installs). Needs root and systemd-nspawn. Exit 77: skipped.
#
# The commands come from README.md itself: each line of the section's ```sh
# blocks that is not a comment runs where the last "# Host" or "# Guest"
# comment above it says; the comment "... the guest panics (CMD) ..." types
# CMD into the guest. Host lines run in a fresh login shell of the user
# (`runuser -l`); guest lines in the guest's root shell, from /root. What the
# test adds around them:
#   before         web1 defined (1 GiB, 2 vCPUs, TCG, the image's disk, its
#                  serial console a socket) and started, as "an existing VM"
#   a guest line   typed once the guest's shell is up (the console log's
#                  HVTRACE-GUEST-READY, printed by the image's root login)
#   reboot         the next line waits for the guest to be up again
#   hvtrace status repeated until meta is connected with a boot accepted
#   hvtrace stream read for 20 s while the guest runs its demo service,
#                  then interrupted (Ctrl-C ends it, as its help says)
#   hvtrace captures  repeated until a panic capture is listed; its ID
#                  replaces <ID> below
# Everything else runs as written and must exit 0. What the test checks
# beyond the lines' exit status: the capture decodes by name, the boot
# timeline (`show --timeline`) places the panicked boot on the host clock
# (>= 3 handshake pairs, error bound < 1 ms: QEMU's side came from the
# domain's libvirt log), and `hvtrace setup --undo` (the section's text)
# gives back the definition the domain had before `hvtrace setup`.
#
#   tests/service/libvirt_readme_test.sh --root-only PACKAGES_DIR
#
# makes (or finds) the test's container root and stops: tests/run.sh fetches
# it while other packages build.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# libvirt_root SUITE DEB OUTTAR: the cached root (build-pkgroot.sh): the
# packages' Depends, libvirt's daemon as Debian sets it up, and sudo.
libvirt_root() {
  "$ROOT/tests/packaging/build-pkgroot.sh" --suite "$1" "$3" "$2" \
    libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients sudo
}
if [ "${1:-}" = --root-only ]; then
  . "$HERE/container.sh"  # packages_suite
  fail() { echo "libvirt_readme_test: FAIL: $*" >&2; exit 1; }
  packages=${2:?usage: libvirt_readme_test.sh --root-only PACKAGES_DIR}
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  libvirt_root "$(packages_suite "$packages")" "$(ls "$packages"/hvtrace_*.deb | tail -n 1)" "$out/root.tar"
  exit
fi
PACKAGES=$(cd "${1:?usage: libvirt_readme_test.sh PACKAGES_DIR IMAGE_DIR}" && pwd)
IMAGE_DIR=$(cd "${2:?usage: libvirt_readme_test.sh PACKAGES_DIR IMAGE_DIR}" && pwd)
ADMIN=carol
VM=web1
SECTION="## Quick start: trace an existing libvirt VM"

# shellcheck source=tests/service/container.sh
. "$HERE/container.sh"
fail() { echo "libvirt_readme_test: FAIL: $*" >&2; exit 1; }
log() { echo "libvirt_readme_test: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "skipped: needs root"; exit 77; }
command -v systemd-nspawn >/dev/null || { log "skipped: no systemd-nspawn"; exit 77; }
deb=$(ls "$PACKAGES"/hvtrace_*.deb 2>/dev/null | tail -n 1)
[ -n "$deb" ] || fail "no hvtrace_*.deb in $PACKAGES (run scripts/build-packages.sh)"
[ -f "$IMAGE_DIR/disk.qcow2" ] || fail "no $IMAGE_DIR/disk.qcow2 (qemu-scripts/build-debian-image.sh)"
suite=$(packages_suite "$PACKAGES")

# The README's lines: "host<TAB>LINE", "guest<TAB>LINE", "panic<TAB>CMD".
mapfile -t STEPS < <(awk -v section="$SECTION" '
  /^## / { if (in_section) exit; if ($0 == section) in_section = 1; next }
  !in_section { next }
  /^```sh$/ { in_block = 1; where = "host"; next }
  /^```/ { in_block = 0; next }
  !in_block || /^[[:space:]]*$/ { next }
  /^# Host/ { where = "host"; next }
  /^# Guest/ { where = "guest"; next }
  /^#.*the guest panics \(/ { sub(/^[^(]*\(/, ""); sub(/\).*$/, ""); print "panic\t" $0; next }
  /^#/ { next }
  { print where "\t" $0 }' "$ROOT/README.md")
[ ${#STEPS[@]} -ge 10 ] || fail "the README's libvirt quick start has ${#STEPS[@]} lines: $(printf '%s; ' "${STEPS[@]}")"

WORK=$(mktemp -d /var/tmp/hvtrace-libvirt.XXXXXX)
TREE=$WORK/root
cleanup() {
  status=$?
  if container_running; then
    if [ $status -ne 0 ]; then
      log "container journal (hvtraced, libvirt's daemons):"
      inside journalctl -u hvtraced -u libvirtd -u virtqemud -u virtlogd --no-pager -n 60 >&2 || true
      log "web1's console:"
      tail -n 40 "$TREE/var/log/libvirt/qemu/$VM-console.log" >&2 || true
    fi
    inside virsh destroy "$VM" >/dev/null 2>&1 || true
    container_stop
  fi
  rm -rf "$WORK"
  exit $status
}
trap cleanup EXIT

status=0
libvirt_root "$suite" "$deb" "$WORK/root.tar" >&2 || status=$?
[ $status -ne 75 ] || { log "skipped: Debian's archive is unreachable and no root is cached"; exit 77; }
[ $status -eq 0 ] || fail "tests/packaging/build-pkgroot.sh failed ($status)"
mkdir "$TREE" && tar -C "$TREE" -xf "$WORK/root.tar"
log "packages: $(basename "$deb") ($PACKAGES, suite $suite); image: $IMAGE_DIR ($(cat "$IMAGE_DIR/kernel-release" 2>/dev/null || echo '?'))"
mkdir -p "$TREE/srv/hvtrace-test"
cp "$deb" "$TREE/srv/hvtrace-test/"
# Multi-threaded TCG breaks the guest kernel's live text patching about once
# in 25 boots (qemu-scripts/libvirt/qemu-tcg-single-thread says more).
install -m 0755 "$ROOT/qemu-scripts/libvirt/qemu-tcg-single-thread" "$TREE/usr/local/bin/"
install -m 0600 "$IMAGE_DIR/disk.qcow2" "$TREE/var/lib/libvirt/images/$VM.qcow2"
# The one change to Debian's qemu.conf: on a cgroup v1 (or hybrid) host,
# systemd-nspawn mounts the container's controller hierarchies read-only, and
# libvirt fails every start ("Failed to create v1 controller cpu for group:
# Read-only file system"). A container limit, not a setting users need.
if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]; then
  echo 'cgroup_controllers = [ ]' >>"$TREE/etc/libvirt/qemu.conf"
fi
# The host's name resolves, as on any installed host (sudo asks).
echo hvtrace-host >"$TREE/etc/hostname"
echo "127.0.1.1 hvtrace-host" >>"$TREE/etc/hosts"
chroot "$TREE" useradd -m -s /bin/bash "$ADMIN"
echo "$ADMIN ALL=(ALL) NOPASSWD: ALL" >"$TREE/etc/sudoers.d/$ADMIN"
chmod 0440 "$TREE/etc/sudoers.d/$ADMIN"

log "booting systemd in the container"
container_boot "$TREE" "$WORK/console.log" --hostname=hvtrace-host

# The README's first section installed hvtrace and made the user an admin
# (tests/service/service_test.sh runs that part); here as its outcome.
inside apt-get install -y -q "/srv/hvtrace-test/$(basename "$deb")" >"$WORK/apt.log" 2>&1 ||
  { tail -n 20 "$WORK/apt.log" >&2; fail "installing $(basename "$deb")"; }
inside usermod -aG hvtrace-admin "$ADMIN"
[ "$(inside systemctl is-active hvtraced)" = active ] || fail "hvtraced is not active"

CONSOLE_LOG=/var/log/libvirt/qemu/$VM-console.log
CONSOLE_SOCK=/var/lib/libvirt/qemu/$VM.console
cat >"$TREE/srv/hvtrace-test/$VM.xml" <<XML
<domain type='qemu'>
  <name>$VM</name>
  <memory unit='MiB'>1024</memory>
  <vcpu>2</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <features><acpi/></features>
  <devices>
    <emulator>/usr/local/bin/qemu-tcg-single-thread</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='/var/lib/libvirt/images/$VM.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <serial type='unix'>
      <source mode='bind' path='$CONSOLE_SOCK'/>
      <log file='$CONSOLE_LOG' append='off'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>
XML
inside virsh -q define "/srv/hvtrace-test/$VM.xml" >&2 || fail "virsh define $VM"
# The definition as libvirt keeps it, for `hvtrace setup --undo` at the end.
inside virsh dumpxml --inactive "$VM" >"$WORK/defined.xml" || fail "virsh dumpxml $VM"
# Which of libvirt's daemons answer qemu:///system here is the release's
# packaging (socket activation started them for virsh just now): Debian 12's
# libvirt 9.0 runs the monolithic libvirtd; hvtraced must work with what the
# release installs, monolithic or modular (virtqemud + virtlogd).
lv_units=$(inside systemctl list-units --no-legend --plain --state=active 'libvirtd*' 'virt*' |
  awk '{print $1}' | tr '\n' ' ')
log "libvirt: $(inside virsh version --daemon | grep -i 'running against daemon' || true); active units: $lv_units"

# The guest's console, read and typed from here through the container's root.
host_log=$TREE$CONSOLE_LOG
ready_seen=0
# 600 s: a boot of the Debian image under TCG took 262 s from the reboot to
# its login with two guests and other builds on this 2-core machine
# (2026-12-02, load 8-10), past the 300 s this allowed before.
wait_guest_ready() {  # the next HVTRACE-GUEST-READY after the last one seen
  local n
  for _ in $(seq 1200); do
    n=$(grep -c HVTRACE-GUEST-READY "$host_log" 2>/dev/null || true)
    if [ "${n:-0}" -gt "$ready_seen" ]; then ready_seen=$n; return 0; fi
    sleep 0.5
  done
  fail "$VM's shell did not come up within 600 s"
}
guest() { python3 "$HERE/guest_shell.py" "/proc/$LEADER/root$CONSOLE_SOCK" "$@"; }

inside virsh -q start "$VM" >&2 || fail "virsh start $VM"
wait_guest_ready
qemu_user=$(inside ps -o user= -C qemu-system-x86_64 | head -n 1)
log "$VM is up (QEMU runs as ${qemu_user:-?}, Debian's libvirt default)"
[ "$qemu_user" = libvirt-qemu ] || fail "QEMU runs as '$qemu_user', not libvirt-qemu"

run_host() {  # run_host LINE: in a fresh login shell of the admin
  inside runuser -l "$ADMIN" -c "$1" </dev/null
}
CAPTURE_ID=
after_reboot=0
ran_setup=0 ran_attach=0 ran_stream=0 ran_show=0 ran_timeline=0 ran_guest=0
run_host_line() {
  local line=${1//<ID>/$CAPTURE_ID} out
  echo "README (host)\$ $line" >&2
  case "$line" in
    "hvtrace status "*)
      for _ in $(seq 150); do
        out=$(run_host "$line" 2>&1) || fail "$line: $out"
        grep -qE '^meta +connected, [1-9]' <<<"$out" && break
        sleep 2
      done
      grep -qE '^meta +connected, [1-9]' <<<"$out" || fail "the agent's metadata never arrived: $out" ;;
    "hvtrace stream "*)
      ran_stream=1
      inside runuser -l "$ADMIN" -c "exec $line" >"$WORK/stream.txt" 2>"$WORK/stream.err" </dev/null &
      local stream_pid=$!
      sleep 3
      guest 120 "systemctl restart hvtrace-demo-marker.service" >/dev/null ||
        fail "the guest's demo service did not restart"
      sleep 17
      # Ctrl-C, as a user ends it (to hvtrace itself: nsenter passes no
      # signal on).
      inside pkill -INT -u "$ADMIN" -x hvtrace || true
      wait "$stream_pid" || true
      out=$(head -n 12 "$WORK/stream.txt")
      grep -q "HVTRACE-DEMO-MARKER" "$WORK/stream.txt" ||
        fail "hvtrace stream shows no demo marker: $(head -c 3000 "$WORK/stream.txt") $(cat "$WORK/stream.err")"
      grep -qE 'sched_switch: +prev_comm=[a-z]' "$WORK/stream.txt" ||
        fail "hvtrace stream shows no sched_switch with task names: $(head -c 3000 "$WORK/stream.txt")"
      # Symbols: the agent publishes them seconds after the attach, and the
      # stream picks them up then (its first lines may show addresses).
      grep -qE 'hrtimer_expire_entry: .*function=[a-z_]' "$WORK/stream.txt" ||
        fail "hvtrace stream never names a timer function: $(tail -c 3000 "$WORK/stream.txt")"
      out=$(grep -m 6 -E 'function=[a-z_]|HVTRACE-DEMO-MARKER' "$WORK/stream.txt") ;;
    "hvtrace captures "*)
      for _ in $(seq 300); do
        out=$(run_host "$line" 2>&1) || fail "$line: $out"
        CAPTURE_ID=$(awk '$2 == "panic" {id = $1} END {print id}' <<<"$out")
        [ -n "$CAPTURE_ID" ] && break
        sleep 0.2
      done
      [ -n "$CAPTURE_ID" ] || fail "no panic capture listed: $out" ;;
    *)
      out=$(run_host "$line" 2>&1) || { echo "$out" >&2; fail "as $ADMIN: $line"; } ;;
  esac
  case "$line" in
    "hvtrace setup "*)
      ran_setup=1
      # QEMU's boot-handshake trace events, through libvirt's QEMU
      # namespace (docs/boot-timeline.md): libvirt kept them.
      inside virsh dumpxml --inactive "$VM" >"$WORK/setup.xml"
      grep -q "xmlns:qemu=.http://libvirt.org/schemas/domain/qemu/1.0" "$WORK/setup.xml" &&
        grep -q "<qemu:arg value=.enable=virtio_set_status./>" "$WORK/setup.xml" ||
        fail "libvirt's definition of $VM after hvtrace setup lacks the QEMU trace events"
      out=$(printf '%s\n' "$out" | head -n 4
            echo "(libvirt's definition: $(grep -c '<qemu:arg ' "$WORK/setup.xml") qemu:arg lines," \
                 "$(grep -o 'enable=[a-z_]*' "$WORK/setup.xml" | cut -d= -f2 | tr '\n' ' '))") ;;
    "hvtrace attach "*) ran_attach=1 ;;
    "hvtrace show "*" --timeline"*)
      ran_timeline=1
      echo "$out" >"$WORK/timeline.txt"
      out=$(grep -E '^# ' "$WORK/timeline.txt"
            grep -m 6 -E ' (hvt_virtio_status|virtio_set_status): ' "$WORK/timeline.txt" || true) ;;
    "hvtrace show "*) ran_show=1; echo "$out" >"$WORK/show.txt" ;;
    *"sudo virsh start "*) ready_seen=0; after_reboot=1 ;;  # a new QEMU: a new console log
  esac
  head -n 12 <<<"$out" | sed 's/^/    /' >&2
}
run_guest_line() {
  local line=$1 out rc=0
  echo "README (guest)# $line" >&2
  ran_guest=1
  if [ "$after_reboot" = 1 ]; then wait_guest_ready; after_reboot=0; fi
  if [ "$line" = reboot ]; then
    guest --send "$line"
    after_reboot=1
    return
  fi
  out=$(guest 600 "$line" 2>&1) || rc=$?
  [ $rc -eq 0 ] || { echo "$out" >&2; fail "in the guest: $line (exit $rc)"; }
  tail -n 6 <<<"$out" | sed 's/^/    /' >&2
}

log "the README's libvirt quick start, as $ADMIN (groups: $(inside id -nG "$ADMIN"))"
for step in "${STEPS[@]}"; do
  kind=${step%%$'\t'*}
  line=${step#*$'\t'}
  case "$kind" in
    host)
      if [ "$after_reboot" = 1 ] && [[ $line == hvtrace\ * ]] && [[ $line != "hvtrace adopt "* ]]; then
        wait_guest_ready
        after_reboot=0
      fi
      run_host_line "$line" ;;
    guest) run_guest_line "$line" ;;
    panic)
      echo "README (guest, the panic)# $line" >&2
      guest --send "$line" ;;
  esac
done
[ "$ran_setup$ran_attach$ran_stream$ran_show$ran_timeline$ran_guest" = 111111 ] ||
  fail "the README lacks setup, attach, stream, show, show --timeline or a guest line"
# The capture, read through the daemon: both of the guest's boots since the
# range was enabled decode with names, the demo service's marker among them.
grep -qE 'print: +tracing_mark_write: HVTRACE-DEMO-MARKER' "$WORK/show.txt" ||
  grep -q 'HVTRACE-DEMO-MARKER' "$WORK/show.txt" ||
  fail "hvtrace show $VM/$CAPTURE_ID lacks the demo marker: $(head -c 3000 "$WORK/show.txt")"
grep -qE 'sched_switch: +prev_comm=[a-z]' "$WORK/show.txt" ||
  fail "hvtrace show $VM/$CAPTURE_ID has no named sched_switch"
if run_host "ls /var/lib/hvtrace/vms" >/dev/null 2>&1; then
  fail "$ADMIN can list the state dir: the test would not show that show reads through hvtraced"
fi
log "capture $CAPTURE_ID: $(grep -c . "$WORK/show.txt") lines shown, the demo marker and named sched_switch among them"

# The boot timeline: the panicked boot (the newest "# boot N:" line) placed
# on the host clock by QEMU's trace lines from the domain's libvirt log,
# with enough pairs to trust and an error bound under a millisecond (the
# fit's accuracy, not a timing: docs/boot-timeline.md, "One clock").
placed=$(grep -E '^# boot [0-9]+: ' "$WORK/timeline.txt" | tail -n 1 || true)
[[ $placed =~ \ ([0-9]+)\ handshake\ pairs,\ error\ bound\ ([0-9]+)\.[0-9]+\ us ]] ||
  fail "the newest boot is not on the host clock: '${placed:-no boot line}'; $(head -n 5 "$WORK/timeline.txt")"
pairs=${BASH_REMATCH[1]} bound_us=${BASH_REMATCH[2]}
[ "$pairs" -ge 3 ] || fail "the boot timeline has $pairs handshake pairs, want >= 3: $placed"
[ "$bound_us" -lt 1000 ] || fail "the boot timeline's error bound is $bound_us us, want < 1 ms: $placed"
# Both sides in the merge: the guest's status writes and QEMU's handling.
host_n=$(grep -cE '^[0-9]+\.[0-9]+ +[-+][0-9.]+ +host +.* virtio_set_status: ' "$WORK/timeline.txt" || true)
guest_n=$(grep -cE '^[0-9]+\.[0-9]+ +[-+][0-9.]+ +guest +.* hvt_virtio_status: ' "$WORK/timeline.txt" || true)
[ "$host_n" -gt 0 ] && [ "$guest_n" -gt 0 ] ||
  fail "the timeline lacks one side: $host_n QEMU virtio_set_status, $guest_n guest hvt_virtio_status lines"
log "boot timeline: ${placed#\# }; $host_n QEMU virtio_set_status and $guest_n guest status-write lines"

# The section's way back: `hvtrace setup --undo` restores the definition
# libvirt kept before `hvtrace setup` (the domain still runs, paused by the
# panic: only the persistent definition changes).
out=$(run_host "hvtrace setup --undo $VM" 2>&1) || { echo "$out" >&2; fail "as $ADMIN: hvtrace setup --undo $VM"; }
inside virsh dumpxml --inactive "$VM" >"$WORK/undone.xml"
diff -u "$WORK/defined.xml" "$WORK/undone.xml" >&2 ||
  fail "hvtrace setup --undo $VM left the definition different from before hvtrace setup (diff above)"
log "hvtrace setup --undo $VM: the definition is the one before setup ($(grep -c . "$WORK/undone.xml") lines); $(grep -m 1 'persistent definition' <<<"$out")"
log "PASS"
