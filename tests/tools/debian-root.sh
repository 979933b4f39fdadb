#!/usr/bin/env bash
# A Debian root of one suite with some packages installed, built once with
# mmdebstrap (--variant=minbase, root mode) from Debian's archive and cached:
#
#   tests/tools/debian-root.sh SLOT SUITE OUT PACKAGE...
#
# SUITE: bookworm, trixie, ... (its -updates and -security suites are added).
# OUT ending in .tar: a tarball (a hard link to, or a copy of, the cached one:
# treat it as read-only); anything else: a symlink to the cached directory
# (read-only too; QEMU runs from it, tests/tools/qemu-from-root.sh).
# Cached as ${HVTRACE_CACHE_DIR:-~/.cache/hvtrace}/roots/SLOT-SUITE-KEY{.tar,},
# KEY = the sorted package list + mirrors + this script; one root is kept per
# SLOT-SUITE (an older key is removed when a new one is built). Cold: minutes
# (network); warm: instant. Prints "DEBIAN_ROOT OUT SUITE packages...".
# Exit status 75: Debian's archive cannot be reached and nothing is cached.
# Needs root (mmdebstrap root mode).
set -euo pipefail

[ $# -ge 4 ] || { sed -n 5p "$0" | sed 's/^# *//' >&2; exit 2; }
SLOT=$1 SUITE=$2 OUT=$3
shift 3
mapfile -t packages < <(printf '%s\n' "$@" | LC_ALL=C sort -u)
[ "$(id -u)" -eq 0 ] || { echo "debian-root: needs root (mmdebstrap)" >&2; exit 1; }
case "$SLOT$SUITE" in *[!A-Za-z0-9_.-]*) echo "debian-root: bad slot or suite" >&2; exit 2 ;; esac

CACHE=${HVTRACE_CACHE_DIR:-${HOME:-/root}/.cache/hvtrace}/roots
MIRROR=${HVTRACE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${HVTRACE_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
kind=dir
case "$OUT" in *.tar) kind=tar ;; esac

key=$( { printf '%s\n' "$SUITE" "$kind" "${packages[@]}" "$MIRROR" "$SECURITY_MIRROR"; sha256sum <"$0"; } |
  sha256sum | cut -c1-16)
mkdir -p "$CACHE"
# A QEMU run from a cached root may drop to an unprivileged user
# (-run-with user=) and still load files from it.
chmod 755 "$CACHE"
# close_inherited_fds_and CMD...: CMD in a subshell without this process's
# descriptors above 2 but the lock's (9).
close_inherited_fds_and() (
  for fd in /proc/self/fd/*; do
    fd=${fd##*/}
    if [ "$fd" -gt 2 ] && [ "$fd" -ne 9 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
  done
  exec "$@"
)
# One lock per slot and suite: different roots are built at the same time
# (tests/run.sh fetches some beside the compile; mmdebstrap mostly waits on
# the network and dpkg), the same root once.
exec 9>"$CACHE/.lock-$SLOT-$SUITE"
flock 9
cached="$CACHE/$SLOT-$SUITE-$key"
[ "$kind" = dir ] || cached="$cached.tar"
if [ ! -e "$cached" ]; then
  echo "debian-root: mmdebstrap $SUITE minbase + ${packages[*]}" >&2
  rm -rf "$cached.tmp"
  [ "$kind" = dir ] && target="$cached.tmp" || target="$cached.tmp.tar"
  # mmdebstrap hands apt an InfoFD of the lowest free number and apt runs
  # `cat >&N` with /bin/sh: dash reads no fd above 9 ("Bad fd number"). A
  # caller that left descriptors open (a test process: the 7.3 test
  # modules' root, built inside an e2e test on a fresh machine, 2026-12-02)
  # pushed N to 11. mmdebstrap gets only stdin/stdout/stderr (and the lock).
  if ! close_inherited_fds_and mmdebstrap --mode=root --variant=minbase --architectures=amd64 \
      --include="$(IFS=,; echo "${packages[*]}")" \
      --aptopt='Acquire::Retries "3"' --dpkgopt=force-unsafe-io \
      "$SUITE" "$target" \
      "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
      "deb $SECURITY_MIRROR $SUITE-security main" >"$CACHE/mmdebstrap-$SLOT-$SUITE.log" 2>&1; then
    tail -n 20 "$CACHE/mmdebstrap-$SLOT-$SUITE.log" >&2
    rm -rf "$target"
    if grep -qiE 'Temporary failure resolving|Could not resolve|Failed to fetch|Network is unreachable' \
         "$CACHE/mmdebstrap-$SLOT-$SUITE.log"; then
      exit 75
    fi
    echo "debian-root: mmdebstrap failed (see $CACHE/mmdebstrap-$SLOT-$SUITE.log)" >&2
    exit 1
  fi
  [ "$kind" = tar ] || chmod 755 "$target"
  mv "$target" "$cached"
  # Older roots of the same slot and suite leave the cache.
  for f in "$CACHE/$SLOT-$SUITE"-????????????????{,.tar}; do
    [ ! -e "$f" ] || [ "$f" = "$cached" ] || rm -rf "$f"
  done
fi
mkdir -p "$(dirname "$OUT")"
if [ "$kind" = dir ]; then
  ln -sfn "$cached" "$OUT"
elif [ ! "$cached" -ef "$OUT" ]; then
  ln -f "$cached" "$OUT.tmp" 2>/dev/null || cp "$cached" "$OUT.tmp"
  mv -f "$OUT.tmp" "$OUT"
fi
echo "DEBIAN_ROOT $OUT $SUITE ${packages[*]}"
