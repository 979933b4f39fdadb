#!/usr/bin/env bash
# The README's main command on a machine of another Debian release: a fresh
# container of SUITE (mmdebstrap minbase + systemd, booted with systemd as PID
# 1 under systemd-nspawn, network shared with the host), a clone of this
# checkout's HEAD in it, and there, as root, exactly what the README says to
# run on a fresh machine:
#
#   ./scripts/demo.sh          (install-deps.sh, build, guest image, boot,
#                               trace, crash, the retrieved trace)
#
#   tests/tools/release-demo.sh [SUITE [-- COMMAND...]]   (root; SUITE: trixie)
#
# COMMAND replaces the demo (e.g. `-- ./tests/run.sh`). The container starts
# from Debian's packages only: nothing of this host's build, caches or
# packages goes in but the source tree (git clone, so uncommitted edits do
# not). Takes as long as a fresh machine does (cold compile on 2 cores:
# about 10 min for the demo's targets). Not part of tests/run.sh: its cost is
# a whole fresh machine's; run by hand when the scripts or the release
# change, and say the result where the README's releases table points.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SUITE=trixie
if [ $# -gt 0 ] && [ "$1" != -- ]; then SUITE=$1; shift; fi
[ "${1:-}" != -- ] || shift
COMMAND=("$@")
[ ${#COMMAND[@]} -gt 0 ] || COMMAND=(./scripts/demo.sh)

fail() { echo "release-demo: FAIL: $*" >&2; exit 1; }
log() { echo "release-demo: $*" >&2; }
[ "$(id -u)" -eq 0 ] || fail "needs root (mmdebstrap, systemd-nspawn)"
# The container inherits this process's RLIMIT_CORE. libvirtd there sets
# its QEMU's, and cannot when the hard limit is below what it asks and it
# lacks CAP_SYS_RESOURCE: every libvirt test then fails ("cannot limit core
# file size of process N to 18446744073709551615: Operation not
# permitted"; 2026-12-04, `sudo` (which leaves its command 0:0) on a
# machine whose root lacks CAP_SYS_RESOURCE). Raised here when it can be;
# said before the long run when it cannot.
if ! ulimit -Hc unlimited 2>/dev/null; then
  log "warning: RLIMIT_CORE's hard limit is $(ulimit -Hc) and cannot be raised here (no CAP_SYS_RESOURCE):" \
    "libvirtd in the container will fail to start QEMU; run as root without sudo, from a shell whose limit is unlimited"
fi
# shellcheck source=../service/container.sh
. "$ROOT/tests/service/container.sh"

WORK=$(mktemp -d /var/tmp/hvtrace-release-demo.XXXXXX)
TREE=$WORK/root
cleanup() {
  status=$?
  container_stop
  [ $status -eq 0 ] || { log "container console:"; tail -n 20 "$WORK/console.log" >&2 || true; }
  rm -rf "$WORK"
  exit $status
}
trap cleanup EXIT

# The fresh machine: Debian's minbase with systemd and what a user has to
# have to get the source (git, certificates); sudo, as on a desktop install.
"$ROOT/tests/tools/debian-root.sh" release-demo "$SUITE" "$WORK/root.tar" \
  systemd-sysv dbus ca-certificates git sudo >/dev/null ||
  fail "no $SUITE root (tests/tools/debian-root.sh exit $?)"
mkdir "$TREE" && tar -C "$TREE" -xf "$WORK/root.tar"
cp /etc/resolv.conf "$TREE/etc/resolv.conf"
git clone -q "$ROOT" "$TREE/root/hvtrace"
log "$SUITE container, $(git -C "$ROOT" log --oneline -1)"
# No /dev/kvm in the container: its guests run under TCG, as here anyway.
container_boot "$TREE" "$WORK/console.log"
log "$(inside sh -c '. /etc/os-release; echo "$PRETTY_NAME"'), running: ${COMMAND[*]}"
start=$(date +%s)
status=0
# As a service of the container's systemd (systemd-run), not straight from
# nsenter: a process nsenter puts there stays in this host's cgroup, which
# the container sees as "/..", and the service tests' own containers
# (systemd-nspawn --keep-unit, nested) then fail with "Failed to create
# /../payload subcgroup" (2026-12-03). Delegate=yes: nspawn makes its
# container's cgroups below the service's.
inside systemd-run --quiet --wait --pipe --collect -p Delegate=yes \
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb \
  bash -c 'cd /root/hvtrace && exec "$@"' release-demo "${COMMAND[@]}" </dev/null || status=$?
log "${COMMAND[*]} on $SUITE: exit $status after $(($(date +%s) - start)) s"
log "QEMU $(inside qemu-system-x86_64 --version | head -n 1), $(inside libvirtd --version 2>/dev/null || echo 'no libvirtd')"
exit $status
