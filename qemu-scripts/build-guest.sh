#!/usr/bin/env bash
# Builds the hvtrace test guests: a Debian kernel plus a busybox initramfs.
#
#   qemu-scripts/build-guest.sh [--kernel 6.12|6.1|7.3|all] [--out DIR] [--agent PATH]
#                               [--guest-test PATH] [--with-kexec-kernel] [--with-kexec-other]
#                               [--overlay DIR] [--refresh] [--with-test-modules]
#                               [--other-kernel 6.12|7.3]
#
# Guests (the guest contract, see qemu-scripts/README.md):
#   6.12  newest linux-image-6.12.*-amd64 in bookworm-backports (has the
#         persistent ring buffer, boot_map)
#   6.1   newest linux-image-6.1.*-amd64 in bookworm (+ updates, security)
#   7.3   newest linux-image-7.3.*-amd64 (generic flavour: not -cloud, not
#         -rt) in trixie-backports (persistent ring buffer with the 6.15+
#         layout: global meta, per-CPU meta, scratch area with text address
#         and module list)
# Without --kernel: all three. Debian's 7.x image package is a meta package:
# the kernel is in linux-binary-REL (usr/lib/modules/REL/vmlinuz), the modules
# in linux-modules-REL (usr/lib/modules/REL/kernel/) and config and
# modules.builtin in linux-base-REL (usr/lib/modules/REL/); those three are
# fetched (found with `apt-cache show` of the meta package's Depends) and
# unpacked into one dir. 6.12 and 6.1 ship all in the image package
# (boot/vmlinuz-REL, boot/config-REL, lib/modules/REL/).
# Outputs, per guest, in DIR/<guest>/ (DIR defaults to build/guest of the
# checkout): vmlinuz, initrd.img, kernel-release, config, package, and with
# --with-kexec-kernel initrd-kexec.img (the same initramfs plus the kernel at
# /boot/vmlinuz). With --with-kexec-other (6.12 and 7.3) also other/vmlinuz,
# other/config, other/kernel-release, other/package and initrd-kexec-other.img:
# the same initramfs with ANOTHER build at /boot/vmlinuz (6.12: the newest 6.12
# of bookworm-security, e.g. 6.12.117 beside the backports 6.12.95; 7.3: the
# newest 7.2 of trixie-backports, e.g. 7.2.12 beside 7.3.4) and that build's
# modules, so `hvtrace-kexec-self` boots a different kernel build.
# --other-kernel GUEST puts GUEST's kernel there instead (6.12 -> 7.3: a kernel
# of another persistent-buffer layout); give such images their own --out, as
# the file names are the same.
# Prints one line per guest:
#   GUEST <guest> KERNEL=<abs path> INITRD=<abs path> RELEASE=<uname -r>
# and with --with-kexec-other one more:
#   OTHER <guest> KERNEL=<abs path> INITRD=<abs path> RELEASE=<uname -r>
#
# Downloads and unpacked packages live in ${HVTRACE_CACHE_DIR:-$HOME/.cache/hvtrace}
# so fresh clones reuse them. apt works on a private state (its own sources,
# lists and cache dirs there), so the host's apt configuration is untouched;
# apt verifies the lists' signatures and the packages' hashes, and a cached
# .deb is checked against the SHA256 the signed lists give before it is used.
# The package lists are refreshed when older than HVTRACE_APT_MAX_AGE_HOURS
# (default 24) or with --refresh; without network the cached lists and
# packages are used. An initramfs is rebuilt only when one of its inputs
# (kernel package, init, busybox, helper, agent, test tools, overlay, this
# script) changed, so a run with everything cached takes about a second.
# --guest-test PATH puts the test tools (build/bin/hvtrace-guest-test: dw-write,
# scribble) at /bin/hvtrace-guest-test; only test images ask for them.
# --with-test-modules builds the test modules with trace events
# (tests/guest/modules: hvt_alpha, hvt_beta) against the guest kernel's
# headers (linux-headers-<release> and the -common and linux-kbuild packages
# it depends on, fetched and verified like the kernel, unpacked in the cache,
# never installed) with qemu-scripts/build-test-modules.sh, with the
# kernel's own compiler (the host's gcc-12 for 6.12; for 7.3 trixie's gcc-14
# in a cached trixie root, tests/tools/debian-root.sh: needs root and, the
# first time, Debian's archive), and puts them at
# /lib/modules/<release>/hvtrace-test/*.ko, not loaded by /init (tests load
# them in the order they need).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
CACHE=${HVTRACE_CACHE_DIR:-${HOME:-/root}/.cache/hvtrace}
MAX_AGE_HOURS=${HVTRACE_APT_MAX_AGE_HOURS:-24}
OUT="$ROOT/build/guest"
AGENT=""
AGENT_GIVEN=0
GUEST_TEST=""
GUESTS=(6.12 6.1 7.3)
WITH_KEXEC_KERNEL=0
WITH_KEXEC_OTHER=0
WITH_TEST_MODULES=0
TEST_MODULE_FILES=()
OVERLAY=""
OTHER_KERNEL=""
REFRESH=0
# Modules each initramfs carries, plus whatever they depend on. pvpanic-mmio
# binds the ISA/ACPI `-device pvpanic`, pvpanic-pci binds `-device pvpanic-pci`.
# virtio_blk, virtio_net (and virtio_console where it is not built in) drive
# the disk, NIC and serial devices of the boot-handshake tests; /init loads
# them after hvtrace-boot-probes, so their handshakes are recorded.
# softdog gives the tests a timer callback inside a module that they can fire
# on demand (soft_noboot=1: it only logs), to check that module functions in
# events resolve. qemu_fw_cfg hands the kernel's VMCOREINFO to QEMU's
# `-device vmcoreinfo` at probe, so a vmcore QEMU dumps carries it
# (makedumpfile, crash). HVTRACE_GUEST_EXTRA_MODULES adds more (space-separated names).
read -r -a extra_modules <<<"${HVTRACE_GUEST_EXTRA_MODULES:-}"
MODULES=(pvpanic pvpanic-mmio pvpanic-pci virtio_blk virtio_net virtio_console softdog qemu_fw_cfg "${extra_modules[@]}")

log() { echo "build-guest: $*" >&2; }
die() { echo "build-guest: error: $*" >&2; exit 1; }
usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --kernel)
      [ $# -ge 2 ] || usage
      case "$2" in
        6.12|6.1|7.3) GUESTS=("$2") ;;
        all) GUESTS=(6.12 6.1 7.3) ;;
        *) die "--kernel takes 6.12, 6.1, 7.3 or all, not '$2'" ;;
      esac
      shift 2 ;;
    --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
    --agent) [ $# -ge 2 ] || usage; AGENT=$2; AGENT_GIVEN=1; shift 2 ;;
    --guest-test) [ $# -ge 2 ] || usage; GUEST_TEST=$2; shift 2 ;;
    --with-kexec-kernel) WITH_KEXEC_KERNEL=1; shift ;;
    --with-kexec-other) WITH_KEXEC_OTHER=1; shift ;;
    --with-test-modules) WITH_TEST_MODULES=1; shift ;;
    --overlay) [ $# -ge 2 ] || usage; OVERLAY=$2; shift 2 ;;
    --other-kernel)
      [ $# -ge 2 ] || usage
      case "$2" in
        6.12|7.3) OTHER_KERNEL=$2 ;;
        *) die "--other-kernel takes 6.12 or 7.3, not '$2'" ;;
      esac
      shift 2 ;;
    --refresh) REFRESH=1; shift ;;
    -h|--help) usage ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

for tool in apt-get apt-cache dpkg-deb sha256sum xz gzip cpio modinfo gcc flock busybox; do
  command -v "$tool" >/dev/null || die "'$tool' is missing; run scripts/install-deps.sh"
done
BUSYBOX=$(command -v busybox)
# A dynamically linked busybox (package `busybox`) cannot run alone in the
# initramfs; Debian's busybox-static installs the static one at /bin/busybox.
if LC_ALL=C readelf -l "$BUSYBOX" 2>/dev/null | grep -q 'Requesting program interpreter'; then
  die "$BUSYBOX is dynamically linked; install busybox-static (scripts/install-deps.sh)"
fi

mkdir -p "$CACHE" "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ "$AGENT_GIVEN" -eq 1 ]; then
  [ -f "$AGENT" ] || die "--agent $AGENT: no such file"
  AGENT=$(cd "$(dirname "$AGENT")" && pwd)/$(basename "$AGENT")
elif [ -f "$ROOT/build/bin/hvtrace-agent" ]; then
  AGENT="$ROOT/build/bin/hvtrace-agent"
fi
if [ -n "$GUEST_TEST" ]; then
  [ -f "$GUEST_TEST" ] || die "--guest-test $GUEST_TEST: no such file"
  GUEST_TEST=$(cd "$(dirname "$GUEST_TEST")" && pwd)/$(basename "$GUEST_TEST")
fi
if [ -n "$OVERLAY" ]; then
  [ -d "$OVERLAY" ] || die "--overlay $OVERLAY: no such directory"
  OVERLAY=$(cd "$OVERLAY" && pwd)
fi

started=$(date +%s.%N)

# --- apt, on a private state in the cache -----------------------------------
APT_DIR="$CACHE/apt"
mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$CACHE/debs" "$CACHE/unpacked"
# Concurrent runs (a person and tests/run.sh, or two engineers) share the
# cache; one lock serializes the apt and unpack steps.
exec 8>"$CACHE/.lock"
flock 8

# The Debian mirror the host already uses (first URI serving a bookworm suite),
# so we work wherever the host's apt works; deb.debian.org otherwise.
host_mirror() {
  local uri
  # deb822 stanzas (paragraph mode): the first URI of a stanza whose Suites
  # list has plain "bookworm".
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk 'BEGIN { RS = "" }
        /(^|\n)Suites:[^\n]*[ \t]bookworm([ \t]|\n|$)/ && !/(^|\n)Enabled:[ \t]*no/ {
          if (match($0, /(^|\n)URIs:[ \t]*[^ \t\n]+/)) {
            u = substr($0, RSTART, RLENGTH); sub(/^\n?URIs:[ \t]*/, "", u); print u; exit
          }
        }' || true)
  if [ -z "$uri" ]; then
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
          | awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) while (i <= NF && $(i - 1) !~ /\]$/) i++;
                               if ($(i + 1) == "bookworm") { print $i; exit } }' || true)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}
MIRROR=${HVTRACE_DEBIAN_MIRROR:-$(host_mirror)}
MIRROR=${MIRROR%/}
# The security archive is a sibling of the main one on deb.debian.org-style
# mirrors; elsewhere use the official one.
case "$MIRROR" in
  */debian) SECURITY_MIRROR="${MIRROR}-security" ;;
  *) SECURITY_MIRROR="http://deb.debian.org/debian-security" ;;
esac
SECURITY_MIRROR=${HVTRACE_DEBIAN_SECURITY_MIRROR:-$SECURITY_MIRROR}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$KEYRING" ] || die "$KEYRING is missing (package debian-archive-keyring)"

SOURCES="$APT_DIR/hvtrace.sources"
sources_text="Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates bookworm-backports
Components: main
Signed-By: $KEYRING

Types: deb
URIs: $SECURITY_MIRROR
Suites: bookworm-security
Components: main
Signed-By: $KEYRING

Types: deb
URIs: $MIRROR
Suites: trixie trixie-backports
Components: main
Signed-By: $KEYRING
"
if [ ! -f "$SOURCES" ] || [ "$(cat "$SOURCES")" != "${sources_text%$'\n'}" ]; then
  printf '%s' "$sources_text" >"$SOURCES"
  REFRESH=1
fi

APT_OPTS=(
  -o "Dir::Etc::SourceList=$SOURCES" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
  -o Dir::State::status=/dev/null -o APT::Architecture=amd64
  -o APT::Get::List-Cleanup=1 -o APT::Sandbox::User=root -o Debug::NoLocking=1
  -o Acquire::Retries=3 -o Acquire::http::Timeout=30
)

lists_stamp="$APT_DIR/lists/.updated"
if [ "$REFRESH" -eq 0 ] && [ -f "$lists_stamp" ] \
   && [ -z "$(find "$lists_stamp" -mmin +$((MAX_AGE_HOURS * 60)) 2>/dev/null)" ]; then
  :
else
  log "refreshing package lists from $MIRROR (+ $SECURITY_MIRROR)"
  if apt-get "${APT_OPTS[@]}" -q update >"$APT_DIR/update.log" 2>&1 \
     && ! grep -qE '^(W|E):' "$APT_DIR/update.log"; then
    touch "$lists_stamp"
  elif ls "$APT_DIR"/lists/*_Packages* >/dev/null 2>&1; then
    log "warning: apt-get update failed (see $APT_DIR/update.log); using the cached lists"
  else
    cat "$APT_DIR/update.log" >&2
    die "apt-get update failed and no package lists are cached"
  fi
fi

# Identifies the lists: a resolved choice is kept while it stays the same.
LISTS_ID=$(cat "$APT_DIR"/lists/*_InRelease 2>/dev/null | sha256sum | cut -c1-16)

# `apt-cache show NAME=VERSION`, tried up to three times: it failed now and
# then on this machine with the lists unchanged (2026-12-02, twice in four
# runs of the same command, its error hidden), and a failure here stops a
# whole test run. Its errors are kept in $APT_DIR/show.err.PID for the caller's
# message.
apt_show() {
  local out try
  for try in 1 2 3; do
    if out=$(apt-cache "${APT_OPTS[@]}" show "$1" 2>"$APT_DIR/show.err.$$"); then
      printf '%s\n' "$out"
      return 0
    fi
    sleep "$try"
  done
  return 1
}

# Prints "NAME VERSION" of the newest package whose name matches the extended
# regex $1 and that some suite in $2 (a regex over madison's "uri suite/..."
# column) offers.
newest_package() {
  local name_re=$1 suite_re=$2 names
  names=$(apt-cache "${APT_OPTS[@]}" pkgnames linux-image- | grep -E "$name_re" || true)
  [ -n "$names" ] || return 1
  # shellcheck disable=SC2086  # one word per package name
  apt-cache "${APT_OPTS[@]}" madison $names \
    | awk -F'|' -v re="$suite_re" '{gsub(/ /, "", $1); gsub(/ /, "", $2); if ($3 ~ re) print $2, $1}' \
    | sort -V | tail -n1 | awk '{print $2, $1}'
}

# Downloads package $1 version $2 to path $4 and checks it against SHA256 $3
# (from the signed lists; apt-get download checks it too); the stamp
# $4.sha256 records the hash it matched.
download_deb() {
  local name=$1 version=$2 want=$3 dest=$4 tmp sha
  log "downloading $name $version"
  tmp=$(mktemp -d "$(dirname "$dest")/.download.XXXXXX")
  if ! (cd "$tmp" && apt-get "${APT_OPTS[@]}" -q download "$name=$version" >"$tmp/log" 2>&1); then
    cat "$tmp/log" >&2
    rm -rf "$tmp"
    die "apt-get download $name=$version failed"
  fi
  mv "$tmp"/*.deb "$dest"
  rm -rf "$tmp"
  sha=$(sha256sum "$dest" | cut -d' ' -f1)
  [ "$sha" = "$want" ] || { rm -f "$dest"; die "downloaded $name has SHA256 $sha, the lists say $want"; }
  echo "$want" >"$dest.sha256"
}

# Puts package $1 version $2 into $CACHE/debs, checked against SHA256 $3 (from
# the signed lists), and sets DEB to its path. A cached .deb is hashed once;
# the stamp DEB.sha256 records the hash it matched.
get_kernel_deb() {
  local name=$1 version=$2 want=$3 sha tmp stamp=""
  DEB="$CACHE/debs/${name}_${version//:/%3a}_amd64.deb"
  [ ! -f "$DEB.sha256" ] || read -r stamp <"$DEB.sha256" || true
  if [ -f "$DEB" ] && [ "$stamp" != "$want" ]; then
    sha=$(sha256sum "$DEB" | cut -d' ' -f1)
    if [ "$sha" = "$want" ]; then
      echo "$want" >"$DEB.sha256"
    else
      log "cached $DEB does not match the lists' SHA256; downloading again"
      rm -f "$DEB" "$DEB.sha256"
    fi
  fi
  [ -f "$DEB" ] || download_deb "$name" "$version" "$want" "$DEB"
}

# Prints the SHA256 the lists give for package $1 version $2.
list_sha256() {
  local want
  want=$(apt_show "$1=$2" | sed -n 's/^SHA256: //p' | head -n1 || true)
  [ -n "$want" ] || die "apt-cache gives no SHA256 for $1=$2"
  echo "$want"
}

# The packages that hold the kernel of image package $1 version $2, as
# "NAME=SHA256" words. Empty for the old packaging (6.12, 6.1: the image
# package itself holds boot/vmlinuz-*, boot/config-* and lib/modules/). Since
# Debian's 7.x the image package is a meta package that depends, at its exact
# version, on linux-binary-REL (usr/lib/modules/REL/vmlinuz), linux-modules-REL
# (usr/lib/modules/REL/kernel/) and linux-base-REL (usr/lib/modules/REL/config,
# modules.builtin, modules.order).
kernel_parts() {
  local pkg=$1 version=$2 depends names p out=()
  depends=$(apt_show "$pkg=$version" \
            | sed -n 's/^Depends: //p' | head -n1 || true)
  names=$(echo "$depends" | tr ',' '\n' | awk -v v="$version" '
            { sub(/^[ \t]+/, ""); sub(/[ \t]+$/, "") }
            $1 ~ /^linux-(binary|modules|base)-/ && $2 == "(=" && $3 == v ")" { print $1 }')
  [ -n "$names" ] || return 0
  echo "$names" | grep -q '^linux-binary-' || die "$pkg=$version depends on ${names//$'\n'/, } but on no linux-binary-*"
  echo "$names" | grep -q '^linux-modules-' || die "$pkg=$version depends on ${names//$'\n'/, } but on no linux-modules-*"
  for p in $names; do out+=("$p=$(list_sha256 "$p" "$version")"); done
  echo "${out[*]}"
}

# Resolves, downloads and unpacks the kernel for guest $1; sets PKG,
# PKG_VERSION (the linux-image package), UNPACKED (one dir with all its
# packages unpacked), RELEASE, KERNEL_IMAGE, KERNEL_CONFIG and MODDIR (the
# dir with kernel/ and modules.builtin) for either packaging, and
# KERNEL_SUITE, the Debian release it was built for (its compiler's).
fetch_kernel() {
  local guest=$1 name_re suite_re resolved_file resolved want parts=""
  case "$guest" in
    6.12) name_re='^linux-image-6\.12\.[0-9]+[^-]*-amd64$'; suite_re=' bookworm-backports/'; KERNEL_SUITE=bookworm ;;
    6.1)  name_re='^linux-image-6\.1\.[0-9]+-[0-9]+-amd64$'; suite_re=' bookworm(-updates|-security)?/'; KERNEL_SUITE=bookworm ;;
    # Another 6.12 build for kexec tests: Debian's own 6.12 (security updates).
    6.12-security) name_re='^linux-image-6\.12\.[0-9]+[^-]*-amd64$'; suite_re=' bookworm-security/'; KERNEL_SUITE=bookworm ;;
    # The generic flavour only: "[^-]*" keeps out -cloud-amd64, -rt-amd64 and
    # the -amd64-dbg packages.
    7.3) name_re='^linux-image-7\.3\.[0-9]+[^-]*-amd64$'; suite_re=' trixie-backports/'; KERNEL_SUITE=trixie ;;
    # Another build for the 7.3 guest's kexec tests: the newest 7.2.
    7.2) name_re='^linux-image-7\.2\.[0-9]+[^-]*-amd64$'; suite_re=' trixie-backports/'; KERNEL_SUITE=trixie ;;
    *) die "internal: no kernel for guest '$guest'" ;;
  esac
  resolved_file="$CACHE/resolved-$guest"
  # apt-cache rebuilds its cache on every call here (~1 s each), so the choice
  # is remembered until the lists change. Line 1: "NAME VERSION SHA256
  # LISTS-ID" (build-debian-image.sh reads NAME VERSION of resolved-6.12);
  # line 2, for the split packaging: the kernel_parts words.
  local lists_id=$LISTS_ID recorded recorded_parts
  recorded=$(head -n1 "$resolved_file" 2>/dev/null || true)
  recorded_parts=$(sed -n 2p "$resolved_file" 2>/dev/null || true)
  if [ -n "$recorded" ] && [ "${recorded##* }" = "$lists_id" ]; then
    read -r PKG PKG_VERSION want _ <<<"$recorded"
    parts=$recorded_parts
  else
    resolved=$(newest_package "$name_re" "$suite_re" || true)
    if [ -n "$resolved" ]; then
      read -r PKG PKG_VERSION <<<"$resolved"
      want=$(list_sha256 "$PKG" "$PKG_VERSION")
      parts=$(kernel_parts "$PKG" "$PKG_VERSION")
      printf '%s\n' "$PKG $PKG_VERSION $want $lists_id" ${parts:+"$parts"} >"$resolved_file"
    elif [ -n "$recorded" ]; then
      # Lists unusable (e.g. offline and never updated for this suite): fall
      # back to what an earlier run resolved from signed lists.
      read -r PKG PKG_VERSION want _ <<<"$recorded"
      parts=$recorded_parts
      log "warning: cannot resolve the $guest kernel from the lists; using the earlier choice $PKG $PKG_VERSION"
    else
      die "no package matching $name_re in$suite_re (see $APT_DIR/update.log)"
    fi
  fi

  # The .debs that hold the kernel: the image package itself, or its parts
  # (the meta package has nothing we need and is not fetched).
  local debs=() p
  if [ -z "$parts" ]; then
    get_kernel_deb "$PKG" "$PKG_VERSION" "$want"
    debs=("$DEB")
  else
    for p in $parts; do
      get_kernel_deb "${p%%=*}" "$PKG_VERSION" "${p#*=}"
      debs+=("$DEB")
    done
  fi

  UNPACKED="$CACHE/unpacked/${PKG}_${PKG_VERSION//:/%3a}"
  if [ ! -f "$UNPACKED/.complete" ]; then
    rm -rf "$UNPACKED" "$UNPACKED.tmp"
    mkdir -p "$UNPACKED.tmp"
    for p in "${debs[@]}"; do
      log "unpacking $(basename "$p")"
      dpkg-deb -x "$p" "$UNPACKED.tmp"
    done
    touch "$UNPACKED.tmp/.complete"
    mv "$UNPACKED.tmp" "$UNPACKED"
  fi
  local found=()
  # Old packaging: boot/vmlinuz-REL, boot/config-REL, lib/modules/REL/.
  found=("$UNPACKED"/boot/vmlinuz-*)
  if [ -f "${found[0]}" ]; then
    KERNEL_IMAGE=${found[0]}
    RELEASE=${KERNEL_IMAGE##*/vmlinuz-}
    KERNEL_CONFIG="$UNPACKED/boot/config-$RELEASE"
    MODDIR="$UNPACKED/lib/modules/$RELEASE"
  else
    # Split packaging: everything under usr/lib/modules/REL/.
    found=("$UNPACKED"/usr/lib/modules/*/vmlinuz)
    [ -f "${found[0]}" ] || die "$PKG $PKG_VERSION has neither boot/vmlinuz-* nor usr/lib/modules/*/vmlinuz"
    KERNEL_IMAGE=${found[0]}
    MODDIR=${KERNEL_IMAGE%/vmlinuz}
    RELEASE=${MODDIR##*/}
    KERNEL_CONFIG="$MODDIR/config"
    [ -f "$KERNEL_CONFIG" ] || KERNEL_CONFIG="$UNPACKED/boot/config-$RELEASE"
  fi
  [ -f "$KERNEL_CONFIG" ] || die "$PKG $PKG_VERSION has no kernel config (boot/config-$RELEASE, usr/lib/modules/$RELEASE/config)"
  [ -d "$MODDIR/kernel" ] || die "$PKG $PKG_VERSION has no modules in ${MODDIR#"$UNPACKED"/}/kernel"
}

# Downloads package $1 version $2 into $CACHE/headers/debs (checked against
# the SHA256 of the signed lists, as the kernel is) and prints its path.
fetch_verified_deb() {
  local name=$1 version=$2 deb want sha tmp
  want=$(apt_show "$name=$version" | sed -n 's/^SHA256: //p' | head -n1 || true)
  [ -n "$want" ] || die "apt-cache gives no SHA256 for $name=$version"
  mkdir -p "$CACHE/headers/debs"
  deb="$CACHE/headers/debs/${name}_${version//:/%3a}_amd64.deb"
  if [ -f "$deb" ] && [ "$(cat "$deb.sha256" 2>/dev/null)" = "$want" ]; then
    echo "$deb"
    return 0
  fi
  rm -f "$deb" "$deb.sha256"
  download_deb "$name" "$version" "$want" "$deb"
  echo "$deb"
}

# The test modules for the kernel fetch_kernel resolved: fetches its headers
# (linux-headers-$RELEASE, its -common and linux-kbuild packages), unpacks them side by side in the cache and builds
# the modules there (build-test-modules.sh); sets TEST_MODULE_FILES.
fetch_test_modules() {
  local headers="linux-headers-$RELEASE" depends pkgs=() p root key dir deb
  depends=$(apt_show "$headers=$PKG_VERSION" \
            | sed -n 's/^Depends: //p' | head -n1 || true)
  [ -n "$depends" ] || die "no $headers=$PKG_VERSION in the lists (needed by --with-test-modules): $(tail -n 3 "$APT_DIR/show.err.$$" 2>/dev/null)"
  pkgs=("$headers")
  # The tree is linux-headers-*-common and linux-kbuild-* (same source
  # version); linux-base, the image and the compiler are not part of it.
  for p in $(echo "$depends" | tr ',' '\n' | tr -d ' ' \
             | sed -n "s/^\(linux-\(headers\|kbuild\)-[^(|]*\)\((=${PKG_VERSION//./\\.})\)\{0,1\}\$/\1/p"); do
    pkgs+=("$p")
  done
  key="${pkgs[*]} $PKG_VERSION"
  root="$CACHE/headers/${RELEASE}_${PKG_VERSION//:/%3a}"
  # .kbuild-depends came with the KBUILD_OUTPUT fix: a tree without it is
  # unpacked again.
  if [ ! -f "$root/.complete" ] || [ ! -f "$root/.kbuild-depends" ]; then
    rm -rf "$root" "$root.tmp"
    mkdir -p "$root.tmp"
    for p in "${pkgs[@]}"; do
      log "unpacking $p $PKG_VERSION"
      deb=$(fetch_verified_deb "$p" "$PKG_VERSION")
      dpkg-deb -x "$deb" "$root.tmp"
      # What kbuild's prebuilt tools (modpost, objtool, ...) link against,
      # for the root build-test-modules.sh builds in when the host has not
      # the kernel's compiler: package names, versions and alternatives
      # dropped (the root is of the kernel's own release).
      case "$p" in
        linux-kbuild-*)
          dpkg-deb -f "$deb" Depends | tr ',' '\n' \
            | sed 's/|.*//; s/(.*//; s/:any//; s/[[:space:]]//g' | sed '/^$/d' >"$root.tmp/.kbuild-depends" ;;
      esac
    done
    [ -f "$root.tmp/.kbuild-depends" ] || die "none of ${pkgs[*]} is a linux-kbuild-* package"
    # The headers' Makefile names the -common tree (include) and, since 7.x,
    # itself (KBUILD_OUTPUT) by absolute path (/usr/src/...): point both at
    # the copy here.
    sed -i -e "s|^include /usr/src/|include $root/usr/src/|" \
      -e "s|^KBUILD_OUTPUT=/usr/src/|KBUILD_OUTPUT=$root/usr/src/|" "$root.tmp/usr/src/$headers/Makefile"
    touch "$root.tmp/.complete"
    mv "$root.tmp" "$root"
  fi
  dir=$("$SCRIPT_DIR/build-test-modules.sh" --kdir "$root/usr/src/$headers" --key "$key" --cache "$CACHE" \
          --suite "$KERNEL_SUITE" --packages "$(tr '\n' ' ' <"$root/.kbuild-depends")")
  mapfile -t TEST_MODULE_FILES < <(find "$dir" -maxdepth 1 -name '*.ko' | LC_ALL=C sort)
  [ ${#TEST_MODULE_FILES[@]} -gt 0 ] || die "build-test-modules.sh built no modules in $dir"
}

# Prints the modules to load for $@ (names as given to insmod, without .ko),
# dependencies first. Built-in modules are skipped; a missing module is fatal.
module_order() {
  local moddir=$1; shift
  local -A path=() seen=()
  local f base list files=()
  # The list is read from a here-string (a file), not from a pipe: bash reads
  # a pipe a byte at a time, ~1 s for the ~4,200 module paths of a kernel.
  list=$(find "$moddir/kernel" -name '*.ko*')
  mapfile -t files <<<"$list"
  for f in "${files[@]}"; do
    base=${f##*/}; base=${base%.ko*}
    path[${base//-/_}]=$f
  done
  visit() {
    local key=${1//-/_} deps dep
    [ -z "${seen[$key]:-}" ] || return 0
    seen[$key]=1
    if [ -z "${path[$key]:-}" ]; then
      if grep -qE "/${1//_/[-_]}\.ko$" "$moddir/modules.builtin" 2>/dev/null; then
        return 0
      fi
      die "module $1 is neither in $moddir/kernel nor built in"
    fi
    deps=$(modinfo -F depends "${path[$key]}")
    for dep in ${deps//,/ }; do visit "$dep"; done
    echo "${path[$key]}"
  }
  local m
  for m in "$@"; do visit "$m"; done
}

# module_order, remembered beside the modules (an unpacked package never
# changes once complete): modinfo decompresses each module, ~40 ms a call,
# which made most of a run with everything cached.
cached_module_order() {
  local moddir=$1 key memo f ok=1
  shift
  key=$(printf '%s\n' "$@" | sha256sum | cut -c1-16)
  memo="$moddir/.hvtrace-module-order-$key"
  if [ -f "$memo" ]; then
    while IFS= read -r f; do [ -f "$f" ] || ok=0; done <"$memo"
  else
    ok=0
  fi
  if [ "$ok" -eq 0 ]; then
    module_order "$moddir" "$@" >"$memo.tmp"
    mv "$memo.tmp" "$memo"
  fi
  cat "$memo"
}

# Hash of the helper's source and the compiler: the cached binary is reused
# while both stay the same.
KEXEC_SRC="$SCRIPT_DIR/guest/hvtrace-kexec.c"
kexec_key=$( (cat "$KEXEC_SRC"; gcc --version | head -n1) | sha256sum | cut -c1-16)
KEXEC_BIN="$CACHE/tools/hvtrace-kexec-$kexec_key"
if [ ! -x "$KEXEC_BIN" ]; then
  mkdir -p "$CACHE/tools"
  log "compiling hvtrace-kexec"
  gcc -static -Os -s -Wall -Wextra -Werror -o "$KEXEC_BIN.tmp" "$KEXEC_SRC"
  mv "$KEXEC_BIN.tmp" "$KEXEC_BIN"
fi

for f in "$AGENT" "$GUEST_TEST"; do
  if [ -n "$f" ] && LC_ALL=C readelf -l "$f" 2>/dev/null | grep -q 'Requesting program interpreter'; then
    log "warning: $f is dynamically linked; it will not run in the initramfs"
  fi
done

# Writes the initramfs for the unpacked kernel to $1 (gzip'd newc cpio); with
# $2 = 1 it also carries the kernel at /boot/vmlinuz, with $2 = 2 the other
# build (OTHER_*) there and that build's modules under its own release.
make_initramfs() {
  local dest=$1 with_kernel=$2 stage f
  stage=$(mktemp -d "$OUT/.stage.XXXXXX")
  mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,root,run,etc/hvtrace,boot} \
           "$stage/lib/modules/$RELEASE"
  chmod 1777 "$stage/tmp"
  cp "$BUSYBOX" "$stage/bin/busybox"
  # Applet links from the busybox we ship, so every applet it has is there.
  while IFS= read -r f; do
    [ "$f" = "bin/busybox" ] && continue
    case "$f" in
      bin/*) ln -sf busybox "$stage/$f" ;;
      sbin/*) ln -sf ../bin/busybox "$stage/$f" ;;
      usr/bin/*|usr/sbin/*) ln -sf ../../bin/busybox "$stage/$f" ;;
    esac
  done < <("$BUSYBOX" --list-full)
  install -m 0755 "$SCRIPT_DIR/guest/init" "$stage/init"
  install -m 0755 "$KEXEC_BIN" "$stage/bin/hvtrace-kexec"
  install -m 0755 "$SCRIPT_DIR/guest/hvtrace-kexec-self" "$stage/bin/hvtrace-kexec-self"
  install -m 0755 "$SCRIPT_DIR/guest/hvtrace-boot-probes" "$stage/bin/hvtrace-boot-probes"
  [ -z "$AGENT" ] || install -m 0755 "$AGENT" "$stage/bin/hvtrace-agent"
  [ -z "$GUEST_TEST" ] || install -m 0755 "$GUEST_TEST" "$stage/bin/hvtrace-guest-test"
  : >"$stage/etc/hvtrace/modules"
  for f in "${MODULE_FILES[@]}"; do
    local base=${f##*/}; base=${base%.ko*}
    case "$f" in
      *.ko.xz) xz -dc "$f" >"$stage/lib/modules/$RELEASE/$base.ko" ;;
      *.ko.zst) zstd -qdc "$f" >"$stage/lib/modules/$RELEASE/$base.ko" ;;
      *.ko.gz) gzip -dc "$f" >"$stage/lib/modules/$RELEASE/$base.ko" ;;
      *) cp "$f" "$stage/lib/modules/$RELEASE/$base.ko" ;;
    esac
    echo "$base" >>"$stage/etc/hvtrace/modules"
  done
  if [ ${#TEST_MODULE_FILES[@]} -gt 0 ]; then
    mkdir -p "$stage/lib/modules/$RELEASE/hvtrace-test"
    cp "${TEST_MODULE_FILES[@]}" "$stage/lib/modules/$RELEASE/hvtrace-test/"
  fi
  echo "$RELEASE" >"$stage/etc/hvtrace/kernel-release"
  if [ "$with_kernel" -eq 2 ]; then
    mkdir -p "$stage/lib/modules/$OTHER_RELEASE"
    for f in "${OTHER_MODULE_FILES[@]}"; do
      local obase=${f##*/}; obase=${obase%.ko*}
      case "$f" in
        *.ko.xz) xz -dc "$f" >"$stage/lib/modules/$OTHER_RELEASE/$obase.ko" ;;
        *.ko.zst) zstd -qdc "$f" >"$stage/lib/modules/$OTHER_RELEASE/$obase.ko" ;;
        *.ko.gz) gzip -dc "$f" >"$stage/lib/modules/$OTHER_RELEASE/$obase.ko" ;;
        *) cp "$f" "$stage/lib/modules/$OTHER_RELEASE/$obase.ko" ;;
      esac
    done
  fi
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$stage/etc/passwd"
  printf 'root:x:0:\n' >"$stage/etc/group"
  [ "$with_kernel" -ne 1 ] || cp "$KERNEL_IMAGE" "$stage/boot/vmlinuz"
  [ "$with_kernel" -ne 2 ] || cp "$OTHER_KERNEL_IMAGE" "$stage/boot/vmlinuz"
  [ -z "$OVERLAY" ] || cp -a "$OVERLAY"/. "$stage"/
  (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort \
     | cpio --quiet -o -H newc -R 0:0 --reproducible) | gzip -6 -n >"$dest.tmp"
  mv "$dest.tmp" "$dest"
  rm -rf "$stage"
}

# Everything an initramfs is made of, hashed: equal hash = nothing to do.
inputs_hash() {
  {
    echo "pkg $PKG $PKG_VERSION release $RELEASE"
    printf 'module %s\n' "${MODULE_FILES[@]}"
    sha256sum "$0" "$SCRIPT_DIR/guest/init" "$SCRIPT_DIR/guest/hvtrace-kexec-self" \
      "$SCRIPT_DIR/guest/hvtrace-boot-probes" "$KEXEC_BIN" "$BUSYBOX" \
      | cut -d' ' -f1
    if [ -n "$AGENT" ]; then echo "agent"; sha256sum <"$AGENT"; fi
    if [ -n "$GUEST_TEST" ]; then echo "guest-test"; sha256sum <"$GUEST_TEST"; fi
    if [ ${#TEST_MODULE_FILES[@]} -gt 0 ]; then echo "test-modules"; sha256sum "${TEST_MODULE_FILES[@]}"; fi
    if [ -n "$OVERLAY" ]; then
      echo "overlay"
      (cd "$OVERLAY" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum)
      (cd "$OVERLAY" && find . -printf '%p %m %l\n' | LC_ALL=C sort)
    fi
  } | sha256sum | cut -d' ' -f1
}

for guest in "${GUESTS[@]}"; do
  fetch_kernel "$guest"
  TEST_MODULE_FILES=()
  [ "$WITH_TEST_MODULES" -eq 0 ] || fetch_test_modules
  order=$(cached_module_order "$MODDIR" "${MODULES[@]}")
  mapfile -t MODULE_FILES <<<"$order"
  dir="$OUT/$guest"
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  hash=$(inputs_hash)
  up_to_date=1
  [ "$(cat "$dir/.inputs" 2>/dev/null)" = "$hash" ] || up_to_date=0
  for f in vmlinuz initrd.img kernel-release config; do
    [ -f "$dir/$f" ] || up_to_date=0
  done
  if [ "$up_to_date" -eq 0 ]; then
    log "building $guest guest: $PKG $PKG_VERSION ($RELEASE), modules: $(printf '%s ' "${MODULE_FILES[@]##*/}")"
    rm -f "$dir/.inputs"
    # Files are replaced by rename, so a QEMU already reading one keeps a
    # consistent copy.
    cp "$KERNEL_IMAGE" "$dir/vmlinuz.tmp" && mv "$dir/vmlinuz.tmp" "$dir/vmlinuz"
    cp "$KERNEL_CONFIG" "$dir/config.tmp" && mv "$dir/config.tmp" "$dir/config"
    echo "$RELEASE" >"$dir/kernel-release.tmp" && mv "$dir/kernel-release.tmp" "$dir/kernel-release"
    echo "$PKG $PKG_VERSION" >"$dir/package.tmp" && mv "$dir/package.tmp" "$dir/package"
    make_initramfs "$dir/initrd.img" 0
    echo "$hash" >"$dir/.inputs"
  fi
  # The kexec image is sticky: once asked for, later runs (tests/run.sh runs
  # without the flag) keep it in step with initrd.img instead of dropping it.
  if [ "$WITH_KEXEC_KERNEL" -eq 1 ] || [ -f "$dir/initrd-kexec.img" ]; then
    if [ "$(cat "$dir/.inputs-kexec" 2>/dev/null)" != "$hash" ] || [ ! -f "$dir/initrd-kexec.img" ]; then
      log "building $guest kexec initramfs (with /boot/vmlinuz)"
      rm -f "$dir/.inputs-kexec"
      make_initramfs "$dir/initrd-kexec.img" 1
      echo "$hash" >"$dir/.inputs-kexec"
    fi
  fi
  other_line=""
  # The other build for kexec tests: 6.12 -> the bookworm-security 6.12,
  # 7.3 -> the newest 7.2 of trixie-backports; 6.1 has none.
  case "$guest" in
    6.12) other_guest=6.12-security ;;
    7.3) other_guest=7.2 ;;
    *) other_guest="" ;;
  esac
  [ -z "$OTHER_KERNEL" ] || [ "$OTHER_KERNEL" = "$guest" ] || other_guest=$OTHER_KERNEL
  if [ -n "$other_guest" ] && { [ "$WITH_KEXEC_OTHER" -eq 1 ] || [ -f "$dir/initrd-kexec-other.img" ]; }; then
    # The other build's package, then back to this guest's for the loop.
    saved=("$PKG" "$PKG_VERSION" "$UNPACKED" "$RELEASE" "$KERNEL_IMAGE" "$KERNEL_CONFIG" "$MODDIR" "$KERNEL_SUITE")
    fetch_kernel "$other_guest"
    OTHER_PKG=$PKG OTHER_PKG_VERSION=$PKG_VERSION OTHER_RELEASE=$RELEASE
    OTHER_KERNEL_IMAGE=$KERNEL_IMAGE OTHER_KERNEL_CONFIG=$KERNEL_CONFIG OTHER_MODDIR=$MODDIR
    PKG=${saved[0]} PKG_VERSION=${saved[1]} UNPACKED=${saved[2]} RELEASE=${saved[3]}
    KERNEL_IMAGE=${saved[4]} KERNEL_CONFIG=${saved[5]} MODDIR=${saved[6]} KERNEL_SUITE=${saved[7]}
    [ "$OTHER_RELEASE" != "$RELEASE" ] || die "the other $guest build ($other_guest) has this guest's release $RELEASE"
    other_order=$(cached_module_order "$OTHER_MODDIR" "${MODULES[@]}")
    mapfile -t OTHER_MODULE_FILES <<<"$other_order"
    other_hash=$( (echo "$hash other $OTHER_PKG $OTHER_PKG_VERSION"; printf '%s\n' "${OTHER_MODULE_FILES[@]}") \
                  | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$dir/.inputs-kexec-other" 2>/dev/null)" != "$other_hash" ] \
       || [ ! -f "$dir/initrd-kexec-other.img" ] || [ ! -f "$dir/other/vmlinuz" ]; then
      log "building $guest kexec-other initramfs (/boot/vmlinuz = $OTHER_PKG $OTHER_PKG_VERSION)"
      rm -f "$dir/.inputs-kexec-other"
      mkdir -p "$dir/other"
      cp "$OTHER_KERNEL_IMAGE" "$dir/other/vmlinuz.tmp" && mv "$dir/other/vmlinuz.tmp" "$dir/other/vmlinuz"
      cp "$OTHER_KERNEL_CONFIG" "$dir/other/config.tmp" && mv "$dir/other/config.tmp" "$dir/other/config"
      echo "$OTHER_RELEASE" >"$dir/other/kernel-release"
      echo "$OTHER_PKG $OTHER_PKG_VERSION" >"$dir/other/package"
      make_initramfs "$dir/initrd-kexec-other.img" 2
      echo "$other_hash" >"$dir/.inputs-kexec-other"
    fi
    other_line="OTHER $guest KERNEL=$dir/other/vmlinuz INITRD=$dir/initrd-kexec-other.img RELEASE=$OTHER_RELEASE"
  fi
  exec 9>&-
  echo "GUEST $guest KERNEL=$dir/vmlinuz INITRD=$dir/initrd.img RELEASE=$RELEASE"
  [ -z "$other_line" ] || echo "$other_line"
done

# Kernels no guest uses any more (the lists moved on) leave the cache; this is
# under the cache lock, so no concurrent run is unpacking them.
keep=" "
for f in "$CACHE"/resolved-*; do
  [ -f "$f" ] || continue
  read -r p v _ <"$f"
  keep+="${p}_${v//:/%3a} "
  # The split packaging's parts (line 2: NAME=SHA256 words) share the version.
  # shellcheck disable=SC2013  # one word per part
  for part in $(sed -n 2p "$f"); do
    keep+="${part%%=*}_${v//:/%3a} "
  done
done
for f in "$CACHE"/unpacked/* "$CACHE"/debs/*.deb; do
  [ -e "$f" ] || continue
  base=${f##*/}; base=${base%_amd64.deb}
  case "$keep" in
    *" $base "*) ;;
    *) log "removing unused $f"; rm -rf "$f" "$f.sha256" ;;
  esac
done

log "done in $(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f s", e - s }')"
