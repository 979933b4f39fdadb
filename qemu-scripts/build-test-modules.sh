#!/usr/bin/env bash
# Builds the out-of-tree test modules (tests/guest/modules/*/: hvt_alpha,
# hvt_beta, GPL, each with trace events) against a kernel's headers:
#
#   qemu-scripts/build-test-modules.sh --kdir DIR --key TEXT --cache DIR
#                                      [--suite SUITE [--packages "PKG..."]]
#
# DIR is an unpacked linux-headers-<release> tree (.../usr/src/linux-headers-*
# of Debian's linux-headers-<release>, -common and linux-kbuild packages
# unpacked side by side, so its relative links resolve, its Makefile's
# absolute paths pointing into that copy); TEXT names it for the cache
# (package names and versions). The .ko files land in
# <cache>/test-modules/<hash>/, where <hash> covers the module sources, TEXT,
# the compiler (its --version line, and the root it runs in) and this
# script: an unchanged input is not rebuilt. Prints that directory.
# build-guest.sh --with-test-modules calls this; nothing is installed on the
# host.
#
# The compiler must be the one the kernel was built with (modules with
# another compiler load, but Kbuild warns and the ABI is not promised): the
# headers' CONFIG_CC_VERSION_TEXT names it. The host's gcc is used when it is
# that compiler (bookworm's gcc-12 for Debian 12's 6.12). Otherwise, with
# --suite, make runs chrooted in a Debian SUITE root with that gcc, make and
# PKG... (what the kernel's kbuild tools link against: trixie's gcc-14,
# libelf1t64, ... for Debian 13's 7.x, whose modpost and objtool need trixie's
# libc): tests/tools/debian-root.sh builds it once from Debian's archive and
# caches it read-only; the build sees it through a throwaway overlay in a
# private mount namespace, with the headers (read-only) and the work dir
# bound at their host paths.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
SRC="$ROOT/tests/guest/modules"
KDIR="" KEY="" CACHE="" SUITE="" PACKAGES=""

die() { echo "build-test-modules: error: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --kdir) KDIR=$2; shift 2 ;;
    --key) KEY=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --suite) SUITE=$2; shift 2 ;;
    --packages) PACKAGES=$2; shift 2 ;;
    *) die "unknown argument '$1'" ;;
  esac
done
if [ -z "$KDIR" ] || [ -z "$KEY" ] || [ -z "$CACHE" ]; then
  die "usage: --kdir DIR --key TEXT --cache DIR [--suite SUITE [--packages \"PKG...\"]]"
fi
[ -f "$KDIR/Makefile" ] || die "$KDIR has no Makefile (not a kernel headers tree)"
KDIR=$(cd "$KDIR" && pwd)
command -v make >/dev/null || die "'make' is missing; run scripts/install-deps.sh"

# The kernel's compiler, from its config.
cc_text=$(sed -n 's/^CONFIG_CC_VERSION_TEXT="\(.*\)"$/\1/p' "$KDIR/.config" 2>/dev/null || true)
cc_version=$(sed -n 's/^CONFIG_GCC_VERSION=\([0-9]*\)$/\1/p' "$KDIR/.config" 2>/dev/null || true)
[ -n "$cc_version" ] || die "$KDIR/.config gives no CONFIG_GCC_VERSION"
gcc_major=$((cc_version / 10000))
CC=x86_64-linux-gnu-gcc-$gcc_major

# 0 when the --version line $1 is the kernel's compiler:
# "x86_64-linux-gnu-gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0", from "(" on.
kernels_compiler() {
  case "$cc_text" in
    *"(${1#*(}"*) return 0 ;;
    *) return 1 ;;
  esac
}

# Where make runs: the host when its gcc is the kernel's, else a Debian root
# with that gcc (BUILD_ROOT). CC_ID names the compiler for the cache key.
BUILD_ROOT=""
host_cc=""
! command -v "$CC" >/dev/null || host_cc=$("$CC" --version | head -n1)
if [ -n "$host_cc" ] && kernels_compiler "$host_cc"; then
  CC_ID="host $host_cc"
elif [ -n "$SUITE" ]; then
  [ "$(id -u)" -eq 0 ] || die "the kernel was built with '$cc_text'; building in a $SUITE root needs root"
  # "prefix/usr/src/linux-headers-X": the unpacked packages' root, bound whole.
  TREE=${KDIR%/usr/src/*}
  if [ -z "$TREE" ] || [ "$TREE" = "$KDIR" ]; then
    die "$KDIR is not an unpacked .../usr/src/linux-headers-* tree"
  fi
  mkdir -p "$CACHE/test-modules"
  read -r -a root_packages <<<"$PACKAGES"
  status=0
  "$ROOT/tests/tools/debian-root.sh" modules "$SUITE" "$CACHE/test-modules/root-$SUITE" \
    "gcc-$gcc_major" make "${root_packages[@]}" >&2 || status=$?
  [ "$status" -eq 0 ] || die "no $SUITE root with gcc-$gcc_major (tests/tools/debian-root.sh exit $status)"
  BUILD_ROOT=$(cd "$CACHE/test-modules/root-$SUITE" && pwd -P)
  root_cc=$(chroot "$BUILD_ROOT" "$CC" --version | head -n1)
  kernels_compiler "$root_cc" ||
    echo "build-test-modules: warning: kernel built with '$cc_text', $SUITE has '$root_cc'" >&2
  CC_ID="root ${BUILD_ROOT##*/} $root_cc"
else
  [ -n "$host_cc" ] || die "the kernel was built with '$cc_text'; $CC is missing on this host (--suite builds in a Debian root)"
  echo "build-test-modules: warning: kernel built with '$cc_text', host has '$host_cc'" >&2
  CC_ID="host $host_cc"
fi

hash=$( {
  echo "key $KEY"
  echo "cc $CC_ID"
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
  build=(make -C "$KDIR" M="$work/$name" CC="$CC" CONFIG_DEBUG_INFO_BTF_MODULES= modules)
  if [ -n "$BUILD_ROOT" ]; then
    # The headers (read-only) and the work dir at their host paths, so the
    # Makefiles' absolute paths and M= resolve as on the host.
    build=("$ROOT/tests/tools/debian-root-run.sh" "$BUILD_ROOT" --bind "$TREE:$TREE:ro"
           --bind "$work:$work" -- "${build[@]}")
  fi
  if ! "${build[@]}" >"$work/$name.log" 2>&1; then
    cat "$work/$name.log" >&2
    die "building $name against $KDIR failed${BUILD_ROOT:+ (in $BUILD_ROOT)}"
  fi
  ko="$work/$name/$name.ko"
  [ -f "$ko" ] || die "make built no $name.ko"
  modinfo -F vermagic "$ko" >/dev/null || die "$name.ko has no vermagic"
  cp "$ko" "$work/out/"
  echo "build-test-modules: built $name.ko ($(modinfo -F vermagic "$ko"), $CC_ID)" >&2
done
touch "$work/out/.complete"
rm -rf "$out"
mv "$work/out" "$out"
echo "$out"
