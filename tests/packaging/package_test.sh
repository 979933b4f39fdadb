#!/usr/bin/env bash
# The packaging test (ctest label `package`; tests/packaging/README.md):
#   1. scripts/build-packages.sh --suite SUITE PKGDIR (cached by tree hash)
#   2. dpkg-deb -c: each package holds its expected paths and nothing from
#      tests/, the build tree or a CMake build; the harvest initramfs is
#      root's, valid gzip + newc cpio, with /init and a static busybox
#   3. bash completion: hvtrace's commands and flags, VM names with no daemon
#   4. lintian on the .changes: no error or warning that is not overridden
#   5. hvtrace installed into a throwaway root of SUITE (build-pkgroot.sh
#      --suite, then `dpkg -i` in a chroot): systemd-analyze verify of both units there
#      (ExecStart must be the package's binary), hvtraced --check-config,
#      hvtrace --version, the groups, the directories of tmpfiles.d, purge
#
#   tests/packaging/package_test.sh [--suite SUITE] [PKGDIR]   (default build/packages)
#
# SUITE: the Debian release the packages are for (bookworm, trixie): given,
# or PKGDIR/suite (written by build-packages.sh), else bookworm (packages
# built before that file existed were bookworm's).
# Needs root (chroot, mmdebstrap). Exit 0 only when every check passed.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SUITE=""
if [ "${1:-}" = --suite ]; then
  [ -n "${2:-}" ] || { echo "package_test: --suite needs a release name (bookworm or trixie)" >&2; exit 2; }
  SUITE=$2; shift 2
fi
[ $# -le 1 ] || { sed -n 14p "$0" | sed 's/^# *//' >&2; exit 2; }
PKGDIR=${1:-$ROOT/build/packages}
if [ -z "$SUITE" ]; then
  SUITE=bookworm
  [ ! -s "$PKGDIR/suite" ] || SUITE=$(cat "$PKGDIR/suite")
fi
failures=0
t_start=$(date +%s)
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
section() { printf '\n--- %s (%ss)\n' "$*" "$(( $(date +%s) - t_start ))"; }

section "build the packages for $SUITE"
mapfile -t debs < <("$ROOT/scripts/build-packages.sh" --suite "$SUITE" "$PKGDIR") ||
  { echo "FAIL: build-packages.sh --suite $SUITE $PKGDIR"; exit 1; }
# The root below is the release of PKGDIR/suite: it must be what was built.
built_for=$(cat "$PKGDIR/suite" 2>/dev/null)
[ "$built_for" = "$SUITE" ] || { echo "FAIL: $PKGDIR/suite says '$built_for', not $SUITE"; exit 1; }
[ ${#debs[@]} -eq 3 ] || { echo "FAIL: expected 3 packages, got: ${debs[*]}"; exit 1; }
deb_of() { printf '%s\n' "${debs[@]}" | grep "/$1_" | head -n1; }
HVTRACE_DEB=$(deb_of hvtrace); AGENT_DEB=$(deb_of hvtrace-agent); DEV_DEB=$(deb_of libdwtrace-dev)
for d in "$HVTRACE_DEB" "$AGENT_DEB" "$DEV_DEB"; do
  echo "$(basename "$d"): $(stat -c %s "$d") bytes, installed $(dpkg-deb -f "$d" Installed-Size) KiB"
done

section "contents (dpkg-deb -c)"
check_contents() {  # check_contents DEB PATH...
  local deb=$1; shift
  local list; list=$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|')
  local p
  for p in "$@"; do
    if grep -qxE "$p" <<<"$list"; then ok "$(basename "$deb") has $p"; else fail "$(basename "$deb") lacks $p"; fi
  done
  local bad
  bad=$(grep -E '/tests?/|/build/|obj-|CMakeFiles|_test$|_fuzzer$|\.o$|/bench' <<<"$list" || true)
  if [ -n "$bad" ]; then fail "$(basename "$deb") holds build or test files: $bad"; else ok "$(basename "$deb"): nothing from tests/ or a build tree"; fi
}
# Units: /lib/systemd/system on bookworm, /usr/lib/systemd/system on trixie
# (its systemd.pc; /usr-merge).
check_contents "$HVTRACE_DEB" /usr/sbin/hvtraced /usr/bin/hvtrace '(/usr)?/lib/systemd/system/hvtraced.service' \
  '(/usr)?/lib/systemd/system/run-hvtrace-mem.mount' \
  /etc/hvtrace/hvtraced.conf /usr/lib/sysusers.d/hvtrace.conf /usr/lib/tmpfiles.d/hvtrace.conf \
  /usr/share/bash-completion/completions/hvtrace /usr/share/man/man1/hvtrace.1.gz \
  /usr/share/man/man5/hvtraced.conf.5.gz /usr/share/man/man8/hvtraced.8.gz \
  /usr/share/doc/hvtrace/copyright /usr/lib/hvtrace/harvest-initrd.img
check_contents "$AGENT_DEB" /usr/sbin/hvtrace-agent '(/usr)?/lib/systemd/system/hvtrace-agent.service' \
  /usr/share/initramfs-tools/hooks/hvtrace-agent \
  /usr/share/initramfs-tools/scripts/init-top/hvtrace-agent \
  /usr/share/initramfs-tools/scripts/init-bottom/hvtrace-agent /usr/share/man/man8/hvtrace-agent.8.gz \
  /usr/libexec/hvtrace/hvtrace-boot-probes
check_contents "$DEV_DEB" /usr/include/hvtrace/dwtrace.h /usr/include/hvtrace/dwtrace.hpp \
  /usr/include/hvtrace/region_writer.h '/usr/lib/[^/]+/libhvtrace_dwtrace.a' \
  '/usr/lib/[^/]+/libhvtrace_core.a' '/usr/lib/[^/]+/pkgconfig/dwtrace.pc'
# The agent's page is the agent's; the host package must not ship it.
if dpkg-deb -c "$HVTRACE_DEB" | grep -q 'hvtrace-agent'; then fail "hvtrace ships agent files"; else ok "hvtrace ships no agent files"; fi
conffiles=$(dpkg-deb -I "$HVTRACE_DEB" conffiles 2>/dev/null)
if grep -qx /etc/hvtrace/hvtraced.conf <<<"$conffiles"; then ok "hvtraced.conf is a conffile"; else fail "hvtraced.conf is not a conffile: $conffiles"; fi
# The statically linked agent (it runs from a busybox-less initramfs).
# In /var/tmp: the install test's root below is under it, and its /dev
# nodes open only on a file system mounted without nodev, which Debian 13's
# /tmp (a tmpfs) is not: there every postinst redirect to /dev/null failed
# ("cannot create /dev/null: Permission denied") and bookworm's postinst
# made no /var/lib/hvtrace (2026-12-04, a trixie host).
tmp=$(mktemp -d /var/tmp/hvtrace-package-test.XXXXXX); trap 'rm -rf "$tmp"' EXIT
dpkg-deb -x "$AGENT_DEB" "$tmp/agent"
if LC_ALL=C readelf -l "$tmp/agent/usr/sbin/hvtrace-agent" | grep -q 'program interpreter'; then
  fail "the packaged hvtrace-agent is dynamically linked"
else ok "the packaged hvtrace-agent is static"; fi

tree="$tmp/tree"; mkdir -p "$tree"
dpkg-deb -x "$HVTRACE_DEB" "$tree"; dpkg-deb -x "$AGENT_DEB" "$tree"

# The harvest initramfs (harvest_initrd's default): root's in the package,
# not writable by others (hvtraced refuses it otherwise), a gzip'd newc cpio
# whose /init and static busybox are there, entries owned by root.
harvest=/usr/lib/hvtrace/harvest-initrd.img
owner=$(dpkg-deb -c "$HVTRACE_DEB" | awk -v p=".$harvest" '$6 == p {print $1, $2}')
if [ "$owner" = "-rw-r--r-- root/root" ]; then ok "$harvest in the package: $owner"
else fail "$harvest in the package: want -rw-r--r-- root/root, got '$owner'"; fi
if ! gzip -t "$tree$harvest" 2>/dev/null; then fail "$harvest is not valid gzip"
elif ! cpio_list=$(gzip -dc "$tree$harvest" | cpio -itv --quiet 2>&1); then fail "$harvest is not a valid cpio: $cpio_list"
else
  for want in init bin/busybox bin/sh bin/tar bin/grep; do
    if awk '{print $9}' <<<"$cpio_list" | grep -qx "$want"; then ok "harvest initramfs has /$want"
    else fail "harvest initramfs lacks /$want"; fi
  done
  not_root=$(awk '$3 != "root" || $4 != "root"' <<<"$cpio_list")
  if [ -z "$not_root" ]; then ok "harvest initramfs: $(wc -l <<<"$cpio_list") entries, all root's"
  else fail "harvest initramfs has entries not owned by root: $not_root"; fi
  mkdir "$tmp/harvest" && (cd "$tmp/harvest" && gzip -dc "$tree$harvest" | cpio -id --quiet 2>/dev/null)
  if LC_ALL=C readelf -l "$tmp/harvest/bin/busybox" | grep -q 'program interpreter'; then
    fail "the harvest initramfs's busybox is dynamically linked"
  else ok "the harvest initramfs's busybox is static"; fi
fi
# The man pages named in Documentation= are in the package.
for page in $(grep -hos 'man:[a-z.-]*([0-9])' "$tree"/lib/systemd/system/*.service \
               "$tree"/usr/lib/systemd/system/*.service | sort -u); do
  name=${page#man:}; sec=${name#*(}; sec=${sec%)}; name=${name%(*}
  if [ -f "$tree/usr/share/man/man$sec/$name.$sec.gz" ]; then ok "Documentation=$page is shipped"
  else fail "Documentation=$page: no $name.$sec in the packages"; fi
done

section "bash completion (host bash-completion, packaged hvtrace)"
complete_words() {  # complete_words WORD... : what the packaged completion offers for the last word
  PATH="$tree/usr/bin:$PATH" HVTRACE_SOCKET=/nonexistent/hvtraced.sock bash -c '
    . /usr/share/bash-completion/bash_completion
    . "$0"
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
    _hvtrace; printf "%s\n" "${COMPREPLY[@]}"' "$tree/usr/share/bash-completion/completions/hvtrace" "$@" 2>&1
}
host_suite=$( (. /etc/os-release && echo "${VERSION_CODENAME:-}") 2>/dev/null || true)
if [ "$SUITE" != "$host_suite" ]; then
  # The packaged hvtrace links the libraries of its release and does not run
  # here; the completion script is the same file in every release's package,
  # checked with the host's packages.
  echo "not checked: the $SUITE hvtrace does not run on this ${host_suite:-unknown} host"
elif [ -f /usr/share/bash-completion/bash_completion ]; then
  cmds=$("$tree/usr/bin/hvtrace" --help | awk '/^Subcommands:/{f=1;next} f&&/^  [a-z]/{print $1} f&&/^$/{f=0}')
  offered=$(complete_words hvtrace "" | sort)
  if [ "$(sort <<<"$cmds")" = "$offered" ]; then ok "completion offers exactly hvtrace's $(wc -l <<<"$cmds") commands"
  else fail "completion commands differ from hvtrace --help: $(diff <(sort <<<"$cmds") - <<<"$offered" | tr '\n' ' ')"; fi
  for c in $cmds formats/harvest formats/list fleet/list fleet/fetch; do
    [ "$c" = help ] || [ "$c" = formats ] || [ "$c" = fleet ] && continue
    want=$("$tree/usr/bin/hvtrace" ${c/\// } --help | sed -n '/^Options:/,/^$/p' | grep -oE '^ +(-[a-z],)?--[a-z-]+' |
      tr ',' '\n' | tr -d ' ' | sort -u)
    got=$(complete_words hvtrace ${c/\// } - | sort -u)
    missing=$(comm -23 <(echo "$want") <(echo "$got") | tr '\n' ' ')
    if [ -z "$missing" ]; then ok "completion flags of '${c/\// }'"; else fail "completion of '${c/\// }' lacks $missing"; fi
  done
  # VM names: hvtraced is down here, so nothing, quietly.
  got=$(complete_words hvtrace status "")
  if [ -z "$got" ]; then ok "VM names with hvtraced down: none, no error"; else fail "VM names with hvtraced down printed: $got"; fi
else
  fail "bash-completion is not installed (scripts/install-deps.sh)"
fi

section "lintian"
changes=$(ls "$PKGDIR"/*.changes | head -n1)
# The host's lintian judges another release's packages by its own
# release's layout: trixie's flags every file under /lib (aliased-location:
# /lib is /usr/lib there since usrmerge), which is where bookworm's systemd
# wants units (debian/rules takes the unit directory from the release's
# systemd.pc). That tag is left out for bookworm's packages on a later host
# (2026-12-04, a trixie host: the bookworm .debs' four unit paths).
lintian_args=()
if [ "$SUITE" = bookworm ] && [ "$host_suite" != bookworm ]; then
  lintian_args=(--suppress-tags aliased-location)
fi
lintian_out=$(lintian --fail-on none --display-info "${lintian_args[@]}" "$changes" 2>&1)
echo "$lintian_out"
# I: (info) and P: (pedantic) lines are advice; E: and W: fail the test.
if grep -qE '^[EW]: ' <<<"$lintian_out"; then fail "lintian reports errors or warnings (above)"; else ok "lintian: no errors or warnings"; fi

section "install hvtrace into a throwaway $SUITE root"
pkgtar="$PKGDIR/pkgroot.tar"
"$HERE/build-pkgroot.sh" --suite "$SUITE" "$pkgtar" "$HVTRACE_DEB"
status=$?
if [ $status -eq 75 ]; then
  fail "no network and no cached package root: the install test could not run"
elif [ $status -ne 0 ]; then
  fail "build-pkgroot.sh failed ($status)"
else
  chrootdir="$tmp/root"; mkdir -p "$chrootdir"
  tar -C "$chrootdir" --numeric-owner -xpf "$pkgtar"
  cp "$HVTRACE_DEB" "$chrootdir/tmp/hvtrace.deb"
  in_root() { chroot "$chrootdir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
  # With /proc, as on a real system (systemd-tmpfiles needs it), mounted in a
  # private mount namespace that ends with the command.
  in_root_proc() {
    unshare --mount --propagation private sh -c 'mount -t proc proc "$0/proc" && exec chroot "$0" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"' "$chrootdir" "$@"
  }
  if in_root_proc dpkg -i /tmp/hvtrace.deb; then ok "dpkg -i hvtrace in the chroot"; else fail "dpkg -i hvtrace in the chroot"; fi
  # systemd-analyze verify in the installed root (systemd-sysv is there, so
  # the targets the units name exist; ExecStart= must be the package's
  # binary). The agent's package is unpacked beside it for its unit. --man=no:
  # the pages are checked above; minbase has no man.
  # (Copied, not dpkg-deb -x into the root: that would replace the usrmerge
  # symlink /lib with a directory.)
  cp "$tmp/agent/usr/sbin/hvtrace-agent" "$chrootdir/usr/sbin/"
  # (/lib is that symlink in both releases' roots: the unit is found there
  # wherever the package put it.)
  cp "$(ls "$tmp"/agent/{usr/,}lib/systemd/system/hvtrace-agent.service 2>/dev/null | head -n1)" \
    "$chrootdir/lib/systemd/system/"
  # The root's own systemd-analyze: the host's (bookworm's 252) misreads a
  # trixie root's units (keys it does not know, /run/lock's mount).
  for unit in hvtraced.service run-hvtrace-mem.mount hvtrace-agent.service; do
    out=$(in_root_proc env SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "/lib/systemd/system/$unit" 2>&1)
    status=$?
    # Units they are only ordered against need not be installed.
    filtered=$(grep -vE '^$|(libvirtd)\.service.*not found' <<<"$out" || true)
    if [ $status -eq 0 ] && [ -z "$filtered" ]; then ok "systemd-analyze verify $unit"
    else fail "systemd-analyze verify $unit (status $status): $out"; fi
  done
  if out=$(in_root hvtraced --check-config 2>&1); then ok "hvtraced --check-config"; echo "$out" | head -n 40
  else fail "hvtraced --check-config: $out"; fi
  if out=$(in_root hvtrace --version 2>&1) && grep -q "$(dpkg-deb -f "$HVTRACE_DEB" Version)" <<<"$out"; then
    ok "hvtrace --version: $out"
  else fail "hvtrace --version: $out"; fi
  for g in hvtrace hvtrace-admin; do
    if line=$(in_root getent group "$g"); then ok "group: $line"; else fail "group $g was not created"; fi
  done
  # tmpfiles.d ran (the dh_installtmpfiles snippet) with the groups in place.
  check_dir() {  # check_dir PATH MODE OWNER:GROUP
    local got; got=$(in_root stat -c '%a %U:%G' "$1" 2>&1)
    if [ "$got" = "$2 $3" ]; then ok "$1 $got"; else fail "$1: want $2 $3, got $got"; fi
  }
  # systemd (from systemd-sysv) is in the root, so the postinst ran tmpfiles.
  check_dir /var/lib/hvtrace 750 root:hvtrace
  check_dir /var/cache/hvtrace 700 root:root
  # Installed root-owned, and the daemon's default harvest_initrd.
  if got=$(in_root stat -c '%a %U:%G' "$harvest" 2>&1) && [ "$got" = "644 root:root" ]; then
    ok "installed $harvest: $got"
  else fail "installed $harvest: want 644 root:root, got $got"; fi
  if in_root hvtraced --check-config 2>&1 | grep -q "harvest_initrd.*$harvest"; then
    ok "hvtraced --check-config: harvest_initrd = $harvest"
  else fail "hvtraced --check-config does not name $harvest as harvest_initrd"; fi
  # And purges cleanly.
  if in_root_proc dpkg --purge hvtrace >/dev/null; then ok "dpkg --purge hvtrace"; else fail "dpkg --purge hvtrace"; fi
fi

echo
echo "packaging test: $failures failure(s) in $(( $(date +%s) - t_start )) s"
[ "$failures" -eq 0 ]
