#!/usr/bin/env bash
# Builds a throwaway Debian bookworm root (mmdebstrap --variant=minbase) with
# what the hvtrace package needs from Debian already installed, as a tarball:
#
#   tests/packaging/build-pkgroot.sh OUTTAR [HVTRACE_DEB [EXTRA_PACKAGE...]]
#
# Packages: the Depends of HVTRACE_DEB (default: build/packages/hvtrace_*.deb;
# the first of each alternative, versions dropped) + systemd-sysv + dbus, so
# that the tree also boots under `systemd-nspawn --boot`, + EXTRA_PACKAGEs
# (tests/service/libvirt_readme_test.sh: libvirt's daemon and sudo). The local .deb is
# NOT in it: install it yourself (`dpkg -i` in a chroot), the way a user does.
#
# Cached in ${HVTRACE_CACHE_DIR:-~/.cache/hvtrace}/pkgroot/root-SET-KEY.tar,
# SET = "base" or a hash of the EXTRA_PACKAGEs (one root kept per set), KEY =
# the package list + mirror + this script; OUTTAR is a hard link to (or a copy
# of) the cached tarball, so treat it as read-only. Cold ~1 min (mmdebstrap,
# network), warm: instant. Prints "PKGROOT OUTTAR packages...".
# Exit status 75: Debian's archive cannot be reached and nothing is cached.
# Needs root (mmdebstrap root mode).
set -euo pipefail

[ $# -ge 1 ] || { sed -n 5p "$0" | sed 's/^# *//' >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUTTAR=$1
DEB=${2:-}
EXTRA=("${@:3}")
if [ -z "$DEB" ]; then
  DEB=$(ls "$ROOT"/build/packages/hvtrace_*.deb 2>/dev/null | head -n1 || true)
fi
[ -n "$DEB" ] && [ -f "$DEB" ] || { echo "build-pkgroot: no hvtrace .deb (scripts/build-packages.sh build/packages)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "build-pkgroot: needs root (mmdebstrap)" >&2; exit 1; }

CACHE=${HVTRACE_CACHE_DIR:-${HOME:-/root}/.cache/hvtrace}/pkgroot
MIRROR=${HVTRACE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${HVTRACE_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

# "a (>= 1), b | c, d:any" -> "a b d"
mapfile -t packages < <(dpkg-deb -f "$DEB" Depends | tr ',' '\n' |
  sed -e 's/|.*//' -e 's/(.*)//' -e 's/:any//' -e 's/[[:space:]]//g' | grep -v '^$' | LC_ALL=C sort -u)
packages+=(systemd-sysv dbus "${EXTRA[@]}")
set_id=base
[ ${#EXTRA[@]} -eq 0 ] || set_id=$(printf '%s\n' "${EXTRA[@]}" | LC_ALL=C sort | sha256sum | cut -c1-8)

key=$( { printf '%s\n' "${packages[@]}" "$MIRROR" "$SECURITY_MIRROR"; sha256sum <"$0"; } |
  sha256sum | cut -c1-16)
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
tar="$CACHE/root-$set_id-$key.tar"
if [ ! -f "$tar" ]; then
  echo "build-pkgroot: mmdebstrap bookworm minbase + ${packages[*]}" >&2
  if ! mmdebstrap --mode=root --variant=minbase --architectures=amd64 \
      --include="$(IFS=,; echo "${packages[*]}")" \
      --aptopt='Acquire::Retries "3"' --dpkgopt=force-unsafe-io \
      bookworm "$tar.tmp.tar" \
      "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
      "deb $SECURITY_MIRROR bookworm-security main" >"$CACHE/mmdebstrap.log" 2>&1; then
    tail -n 20 "$CACHE/mmdebstrap.log" >&2
    rm -rf "$tar.tmp.tar"
    if grep -qiE 'Temporary failure resolving|Could not resolve|Failed to fetch|Network is unreachable' \
         "$CACHE/mmdebstrap.log"; then
      exit 75
    fi
    echo "build-pkgroot: mmdebstrap failed (see $CACHE/mmdebstrap.log)" >&2
    exit 1
  fi
  mv "$tar.tmp.tar" "$tar"
  # Older roots of the same set leave the cache (and those named before sets).
  for f in "$CACHE"/root-"$set_id"-*.tar "$CACHE"/root-????????????????.tar; do
    [ ! -e "$f" ] || [ "$f" = "$tar" ] || rm -f "$f"
  done
fi
mkdir -p "$(dirname "$OUTTAR")"
if [ ! "$tar" -ef "$OUTTAR" ]; then
  ln -f "$tar" "$OUTTAR.tmp" 2>/dev/null || cp "$tar" "$OUTTAR.tmp"
  mv -f "$OUTTAR.tmp" "$OUTTAR"
fi
echo "PKGROOT $OUTTAR ${packages[*]}"
