#!/usr/bin/env bash
# Builds the out-of-tree test modules (tests/guest/modules/*/: hvt_alpha,
# hvt_beta, GPL, each with trace events) against a kernel's headers:
#
#   qemu-scripts/build-test-modules.sh --kdir DIR --key TEXT --cache DIR
#
# DIR is an unpacked linux-headers-<release> tree (/usr/src/linux-headers-*
# of Debian's linux-headers-<release>, -common and linux-kbuild packages
# unpacked side by side, so its relative links resolve); TEXT names it for
# the cache (package names and versions). The .ko files land in
# <cache>/test-modules/<hash>/, where <hash> covers the module sources, TEXT,
# the compiler and this script: an unchanged input is not rebuilt. Prints
# that directory. build-guest.sh --with-test-modules calls this; nothing is
# installed on the host.
#
# The compiler must be the one the kernel was built with (modules with
# another compiler load, but Kbuild warns and the ABI is not promised):
# the headers' CONFIG_CC_VERSION_TEXT is checked against the host's gcc.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
SRC="$ROOT/tests/guest/modules"
KDIR="" KEY="" CACHE=""

die() { echo "build-test-modules: error: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --kdir) KDIR=$2; shift 2 ;;
    --key) KEY=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    *) die "unknown argument '$1'" ;;
  esac
done
if [ -z "$KDIR" ] || [ -z "$KEY" ] || [ -z "$CACHE" ]; then
  die "usage: --kdir DIR --key TEXT --cache DIR"
fi
[ -f "$KDIR/Makefile" ] || die "$KDIR has no Makefile (not a kernel headers tree)"
command -v make >/dev/null || die "'make' is missing; run scripts/install-deps.sh"

# The kernel's compiler, from its config; the host's must be that gcc.
cc_text=$(sed -n 's/^CONFIG_CC_VERSION_TEXT="\(.*\)"$/\1/p' "$KDIR/.config" 2>/dev/null || true)
cc_version=$(sed -n 's/^CONFIG_GCC_VERSION=\([0-9]*\)$/\1/p' "$KDIR/.config" 2>/dev/null || true)
[ -n "$cc_version" ] || die "$KDIR/.config gives no CONFIG_GCC_VERSION"
gcc_major=$((cc_version / 10000))
CC=x86_64-linux-gnu-gcc-$gcc_major
command -v "$CC" >/dev/null || die "the kernel was built with '$cc_text'; $CC is missing on this host"
host_cc=$("$CC" --version | head -n1)
# "x86_64-linux-gnu-gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0": compare from "(" on.
case "$cc_text" in
  *"(${host_cc#*(}"*) ;;
  *) echo "build-test-modules: warning: kernel built with '$cc_text', host has '$host_cc'" >&2 ;;
esac

hash=$( {
  echo "key $KEY"
  echo "cc $host_cc"
  sha256sum "$0" | cut -d' ' -f1
  (cd "$SRC" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum)
} | sha256sum | cut -c1-16)
out="$CACHE/test-modules/$hash"
if [ -f "$out/.complete" ]; then
  echo "$out"
  exit 0
fi

work=$(mktemp -d "$CACHE/test-modules/.build.XXXXXX" 2>/dev/null ||
       { mkdir -p "$CACHE/test-modules" && mktemp -d "$CACHE/test-modules/.build.XXXXXX"; })
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/out"
for dir in "$SRC"/*/; do
  name=$(basename "$dir")
  cp -r "$dir" "$work/$name"
  # No BTF for the modules (CONFIG_DEBUG_INFO_BTF_MODULES would run pahole,
  # which nothing here needs: the tests read the events' format files).
  if ! make -C "$KDIR" M="$work/$name" CC="$CC" CONFIG_DEBUG_INFO_BTF_MODULES= modules \
       >"$work/$name.log" 2>&1; then
    cat "$work/$name.log" >&2
    die "building $name against $KDIR failed"
  fi
  ko="$work/$name/$name.ko"
  [ -f "$ko" ] || die "make built no $name.ko"
  modinfo -F vermagic "$ko" >/dev/null || die "$name.ko has no vermagic"
  cp "$ko" "$work/out/"
  echo "build-test-modules: built $name.ko ($(modinfo -F vermagic "$ko"))" >&2
done
touch "$work/out/.complete"
rm -rf "$out"
mv "$work/out" "$out"
echo "$out"
