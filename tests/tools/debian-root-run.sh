#!/usr/bin/env bash
# Runs a command chrooted in a cached Debian root (tests/tools/debian-root.sh,
# a directory root) without writing to it:
#
#   tests/tools/debian-root-run.sh ROOT [--bind HOST:INSIDE[:ro]]... [--env NAME=VALUE]... -- CMD...
#
# The root is the lower layer of an overlay whose upper layer is a tmpfs
# (every write the command makes outside its binds goes away with it; a
# copy of the root on that tmpfs when overlayfs is unavailable), mounted in
# a private mount namespace, so every mount ends with the command, also
# when it is killed. /dev and /proc are there; each --bind puts a host
# directory at INSIDE (read-only with :ro). CMD runs with a clean
# environment: PATH, HOME=/root, LC_ALL=C.UTF-8 and the --env pairs. Exit
# status: CMD's. Needs root (mount, chroot). The one way the build scripts
# enter a root of another release: scripts/build-packages.sh --suite (a
# trixie dpkg-buildpackage) and qemu-scripts/build-test-modules.sh (the 7.3
# kernel's gcc-14).
set -euo pipefail

usage() { sed -n 5p "$0" | sed 's/^# *//' >&2; exit 2; }
[ $# -ge 3 ] || usage
[ "$(id -u)" -eq 0 ] || { echo "debian-root-run: needs root (mount, chroot)" >&2; exit 1; }
# Everything below in a mount namespace of its own.
if [ -z "${HVTRACE_ROOT_RUN_NS:-}" ]; then
  HVTRACE_ROOT_RUN_NS=1 exec unshare --mount --propagation private "$0" "$@"
fi
unset HVTRACE_ROOT_RUN_NS

ROOT=$1
shift
[ -d "$ROOT" ] || { echo "debian-root-run: $ROOT is not a directory root" >&2; exit 2; }
binds=() envs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bind) binds+=("${2:?--bind needs HOST:INSIDE}"); shift 2 ;;
    --env) envs+=("${2:?--env needs NAME=VALUE}"); shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ $# -gt 0 ] || usage

stage=$(mktemp -d /tmp/hvtrace-root-run.XXXXXX)
mount -t tmpfs -o mode=0755 hvtrace-root-run "$stage"
mkdir "$stage/upper" "$stage/work" "$stage/merged"
merged=$stage/merged
if ! mount -t overlay overlay -o "lowerdir=$(readlink -f "$ROOT"),upperdir=$stage/upper,workdir=$stage/work" \
    "$merged" 2>/dev/null; then
  echo "debian-root-run: overlayfs unavailable: running in a copy of $ROOT" >&2
  cp -a "$ROOT/." "$merged/"
fi
for b in "${binds[@]}"; do
  IFS=: read -r host inside mode <<<"$b"
  [ -d "$host" ] && [ -n "$inside" ] || { echo "debian-root-run: bad --bind '$b'" >&2; exit 2; }
  mkdir -p "$merged$inside"
  mount --bind "$host" "$merged$inside"
  [ "${mode:-}" != ro ] || mount -o remount,bind,ro "$merged$inside"
done
mount --rbind /dev "$merged/dev"
mount -t proc proc "$merged/proc"
status=0
chroot "$merged" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
  "${envs[@]}" "$@" || status=$?
# The namespace's mounts go with it; the empty mount point is ours to remove.
umount -R "$merged" 2>/dev/null || true
if umount "$stage" 2>/dev/null; then rmdir "$stage"; fi
exit "$status"
