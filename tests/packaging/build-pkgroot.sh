#!/usr/bin/env bash
# Builds a throwaway Debian root (mmdebstrap --variant=minbase) with what the
# hvtrace package needs from Debian already installed, as a tarball:
#
#   tests/packaging/build-pkgroot.sh [--suite SUITE] OUTTAR [HVTRACE_DEB [EXTRA_PACKAGE...]]
#
# SUITE: the Debian release of the root (bookworm, trixie; default bookworm):
# the release the .deb was built for (scripts/build-packages.sh --suite).
#
# Packages: the Depends of HVTRACE_DEB (default: build/packages/hvtrace_*.deb;
# the first of each alternative, versions dropped) + systemd-sysv + dbus, so
# that the tree also boots under `systemd-nspawn --boot`, + EXTRA_PACKAGEs
# (tests/service/libvirt_readme_test.sh: libvirt's daemon and sudo). The local .deb is
# NOT in it: install it yourself (`dpkg -i` in a chroot), the way a user does.
#
# Built and cached by tests/tools/debian-root.sh (slot pkgroot-SET: SET =
# "base" or a hash of the EXTRA_PACKAGEs, one root kept per set; keyed by the
# package list + mirror); OUTTAR is a hard link to (or a copy of) the cached
# tarball, so treat it as read-only. Cold ~1 min (mmdebstrap,
# network), warm: instant. Prints "PKGROOT OUTTAR packages...".
# Exit status 75: Debian's archive cannot be reached and nothing is cached.
# Needs root (mmdebstrap root mode).
set -euo pipefail

SUITE=bookworm
if [ "${1:-}" = --suite ]; then SUITE=${2:?--suite needs a release name}; shift 2; fi
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

# "a (>= 1), b | c, d:any" -> "a b d"
mapfile -t packages < <(dpkg-deb -f "$DEB" Depends | tr ',' '\n' |
  sed -e 's/|.*//' -e 's/(.*)//' -e 's/:any//' -e 's/[[:space:]]//g' | grep -v '^$' | LC_ALL=C sort -u)
packages+=(systemd-sysv dbus "${EXTRA[@]}")
set_id=base
[ ${#EXTRA[@]} -eq 0 ] || set_id=$(printf '%s\n' "${EXTRA[@]}" | LC_ALL=C sort | sha256sum | cut -c1-8)

# The cached mmdebstrap itself is tests/tools/debian-root.sh's (one root per
# set; its status, 75 when offline, is ours).
"$ROOT/tests/tools/debian-root.sh" "pkgroot-$set_id" "$SUITE" "$OUTTAR" "${packages[@]}" >/dev/null
echo "PKGROOT $OUTTAR $SUITE ${packages[*]}"
