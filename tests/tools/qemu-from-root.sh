#!/bin/sh
# Runs the qemu-system-x86_64 of another Debian release's root on this host:
# the root's own dynamic loader and libraries, its module directory and its
# firmware (tests/tools/debian-root.sh builds the root). e2e tests use it as
# $HVTRACE_QEMU (and hvtraced as qemu_binary) to run against Debian 13's
# QEMU 10 on a Debian 12 host:
#
#   HVTRACE_QEMU_ROOT=DIR tests/tools/qemu-from-root.sh QEMU-ARGS...
#
# DIR defaults to build/qemu-trixie-root beside this tree. The root's loader
# and --library-path instead of a chroot: QEMU then sees the host's /dev,
# /dev/shm, /tmp, /run, users and every path hvtraced hands it, exactly as a
# host QEMU would. Its module and firmware directories are the exception:
# QEMU looks for modules in its built-in /usr/lib/x86_64-linux-gnu/qemu
# before QEMU_MODULE_DIR (a host QEMU's modules there abort it: "Only modules
# from the same build can be loaded"), and the root's /usr/share/qemu links
# to /usr/share/seabios etc. by absolute path. So QEMU runs in its own mount
# namespace (unshare -m, private: nothing leaks to the host) with the root's
# directories bound over those four. The exec chain keeps one pid: the pid
# the caller started is QEMU's. Needs root (hvtraced and the e2e tests are).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "${HVTRACE_QEMU_ROOT:-$here/../../build/qemu-trixie-root}" 2>/dev/null && pwd -P) || root=
lib=$root/usr/lib/x86_64-linux-gnu
[ -n "$root" ] && [ -x "$root/usr/bin/qemu-system-x86_64" ] || {
  echo "qemu-from-root: no qemu-system-x86_64 in ${HVTRACE_QEMU_ROOT:-build/qemu-trixie-root} (tests/tools/debian-root.sh)" >&2
  exit 127
}
if [ "${HVTRACE_QEMU_ROOT_NS:-}" != "$root" ]; then
  HVTRACE_QEMU_ROOT_NS=$root HVTRACE_QEMU_ROOT=$root exec unshare -m --propagation private "$0" "$@"
fi
for d in /usr/lib/x86_64-linux-gnu/qemu /usr/share/qemu /usr/share/seabios /usr/lib/ipxe/qemu; do
  [ -d "$root$d" ] && [ -d "$d" ] && mount --bind "$root$d" "$d"
done
unset HVTRACE_QEMU_ROOT_NS
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib:$root/lib/x86_64-linux-gnu" \
  "$root/usr/bin/qemu-system-x86_64" "$@"
