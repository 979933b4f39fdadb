#!/usr/bin/env bash
# Builds the Debian packages hvtrace, hvtrace-agent and libdwtrace-dev from
# the current tree (committed and uncommitted changes to tracked files; new
# files that are not `git add`ed are left out) into OUTDIR, for one Debian
# release, and prints their paths.
#
#   scripts/build-packages.sh [--suite SUITE] OUTDIR
#   scripts/build-packages.sh --suite SUITE --root-only
#
# SUITE: bookworm or trixie (default: the host's release, VERSION_CODENAME
# of /etc/os-release). The packages' Depends are that release's libraries
# (Boost, libvirt, libtraceevent sonames), so they install there and nowhere
# else. OUTDIR/suite names it (tests pick their container root from it).
#
# The host's own release is built on the host, as always: the host is that
# release, its installed Build-Depends are the ones (scripts/install-deps.sh).
# Another release is built in a clean root of it: a cached mmdebstrap tree
# holding debian/control's Build-Depends (tests/tools/debian-root.sh; cold:
# minutes and the network, then instant), mounted as a throwaway overlay in
# a private mount namespace and entered with chroot. That needs root. Exit
# status 75: Debian's archive is unreachable and no such root is cached.
# --root-only makes (or finds) that root and builds nothing: tests/run.sh
# fetches it beside its own compile.
#
# The tree stays clean: the tracked files are copied to a temporary directory
# and dpkg-buildpackage -b -us -uc runs there. Cheap to rerun: OUTDIR/.stamp
# holds the suite and the hash of the tracked files' contents (so a commit
# that changes no file does not rebuild); when it matches and the .debs are
# there, nothing is built. ccache is used when installed (in a root: always,
# its cache in ${HVTRACE_CACHE_DIR:-~/.cache/hvtrace}/ccache-SUITE); the
# copy is always at the same path (${TMPDIR:-/var/tmp}/hvtrace-pkg-build on the
# host, /build in a root; one build per suite at a time, under a lock) so
# that the compiler's -ffile-prefix-map argument, and with it ccache's key,
# stays the same.
set -euo pipefail

usage() { echo "usage: $(sed -n 7p "$0" | sed 's/^# *//')" >&2; exit 2; }
die() { echo "build-packages: $*" >&2; exit 1; }

suite=""
root_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --root-only) root_only=1; shift ;;
    --suite) [ $# -ge 2 ] && [ -n "$2" ] || die "--suite needs a release name (bookworm or trixie)"
             suite=$2; shift 2 ;;
    --suite=*) suite=${1#--suite=}; [ -n "$suite" ] || die "--suite needs a release name (bookworm or trixie)"
               shift ;;
    -h | --help) usage ;;
    --) shift; break ;;
    -*) echo "build-packages: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -eq $((1 - root_only)) ] || usage

host_suite=$( (. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}") || true)
if [ -z "$suite" ]; then
  [ -n "$host_suite" ] || die "no VERSION_CODENAME in /etc/os-release: say which release with --suite bookworm|trixie"
  suite=$host_suite
fi
# The releases whose Build-Depends and packaging were checked (and the host's
# own, which builds with what is installed). Another name would reach
# mmdebstrap, whose 404 for an unknown suite reads like an offline archive.
case $suite in
  bookworm | trixie | "$host_suite") ;;
  *) die "unknown suite '$suite': bookworm or trixie" ;;
esac
in_root=0
[ "$suite" = "$host_suite" ] || in_root=1
if [ "$in_root" = 1 ]; then
  [ "$(id -u)" -eq 0 ] || die "building for $suite on this $host_suite host needs root (mmdebstrap, mount, chroot); run as root, or build on a $suite machine"
  # tests/tools/debian-root.sh makes amd64 roots; a chroot into one needs an
  # amd64 host.
  [ "$(dpkg --print-architecture)" = amd64 ] || die "building in a $suite root needs an amd64 host"
  for tool in mmdebstrap unshare chroot perl; do
    command -v "$tool" >/dev/null || die "$tool is missing (scripts/install-deps.sh)"
  done
fi

src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
# build_root LINK: the cached root of $suite holding debian/control's
# Build-Depends, symlinked at LINK; exit 75 when it cannot be had.
build_root() {
  local status=0
  # The root's packages: every Build-Depends(-Arch, -Indep) relation of
  # debian/control, parsed by dpkg's own parser: architecture restrictions
  # ([amd64]) and build profiles (<!nocheck>) reduced for this build, the
  # first of each set of alternatives, without version or arch qualifier
  # (apt takes names; dpkg-buildpackage checks the versions in the root and
  # names any that is not met). Plus the compiler and ccache; no fakeroot:
  # Rules-Requires-Root: no.
  mapfile -t build_deps < <(perl -MDpkg::Control::Info -MDpkg::Deps -e '
    my $src = Dpkg::Control::Info->new($ARGV[0])->get_source()
      or die "no source paragraph in $ARGV[0]\n";
    for my $field (qw(Build-Depends Build-Depends-Arch Build-Depends-Indep)) {
      next unless defined $src->{$field};
      my $deps = deps_parse($src->{$field}, build_dep => 1, host_arch => "amd64",
                            reduce_arch => 1, reduce_profiles => 1)
        or die "cannot parse $field of $ARGV[0]\n";
      for my $dep ($deps->get_deps()) {
        my @alternatives = $dep->isa("Dpkg::Deps::OR") ? $dep->get_deps() : ($dep);
        print $alternatives[0]->{package}, "\n";
      }
    }' "$src/debian/control") ||
    die "cannot read the Build-Depends of debian/control (above)"
  [ "${#build_deps[@]}" -gt 0 ] || die "debian/control has no Build-Depends"
  echo "build-packages: the $suite build root (tests/tools/debian-root.sh; cold: minutes, needs Debian's archive)" >&2
  "$src/tests/tools/debian-root.sh" pkgbuild "$suite" "$1" \
    "${build_deps[@]}" build-essential ccache >/dev/null || status=$?
  if [ "$status" -eq 75 ]; then
    echo "build-packages: Debian's archive is unreachable and no $suite build root is cached" >&2
    exit 75
  fi
  [ "$status" -eq 0 ] || die "could not make the $suite build root (debian-root.sh exit $status, above)"
}
if [ "$root_only" = 1 ]; then
  [ "$in_root" = 1 ] || die "--root-only: $suite is this host's release, built without a root"
  link=$(mktemp -u "${TMPDIR:-/tmp}/hvtrace-pkg-root.XXXXXX")
  build_root "$link"
  rm -f "$link"
  exit 0
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)

version=$(dpkg-parsechangelog -l "$src/debian/changelog" -S Version)
arch=$(dpkg --print-architecture)
debs=("$out/hvtrace_${version}_${arch}.deb" "$out/hvtrace-agent_${version}_${arch}.deb"
      "$out/libdwtrace-dev_${version}_${arch}.deb")

tree_hash() {  # the suite + the index (modes, blob ids, names) + unstaged edits of tracked files
  (echo "suite $suite"; cd "$src" && git ls-files -s && git diff --binary) | sha256sum | cut -d' ' -f1
}
stamp=$(tree_hash)

have_all=1
for d in "${debs[@]}"; do [ -f "$d" ] || have_all=0; done
if [ "$have_all" = 1 ] && [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ]; then
  echo "build-packages: up to date ($suite, tree $stamp)" >&2
  echo "$suite" >"$out/suite"
  printf '%s\n' "${debs[@]}"
  exit 0
fi

# One build per suite at a time (the fixed path is ccache's key); a host
# build and a root build may run side by side. /var/tmp, not /tmp: Debian 13
# mounts /tmp as a tmpfs (tmp.mount: half of RAM; in a systemd-nspawn
# container a tenth, 2.4 GB on this 24 GB machine), and a build with
# Debian's -g filled that ("No space left on device" in dh_install,
# tests/tools/release-demo.sh trixie, 2026-12-04).
work="${TMPDIR:-/var/tmp}/hvtrace-pkg-build"
[ "$in_root" = 0 ] || work="$work-$suite"
mkdir -p "$work"
exec 9>"$work.lock"
flock 9
trap 'rm -rf "$work"' EXIT
rm -rf "${work:?}"/*
# The copy's parent collects dpkg-buildpackage's output (.deb, .changes).
if [ "$in_root" = 0 ]; then build="$work"; else build="$work/build"; fi
mkdir -p "$build/hvtrace-$version"
# Tracked files as they are in the work tree (including uncommitted edits).
git -C "$src" ls-files -z --cached | (cd "$src" && xargs -0 cp -P --parents -t "$build/hvtrace-$version" 2>/dev/null || true)
# Files deleted in the work tree but still tracked are skipped by cp; check
# that the copy has what debian/ needs.
[ -f "$build/hvtrace-$version/debian/rules" ] || die "debian/rules missing from the copy"

jobs="parallel=${HVTRACE_JOBS:-2} ${DEB_BUILD_OPTIONS:-}"
if [ "$in_root" = 0 ]; then
  launcher=""
  if command -v ccache >/dev/null; then
    launcher=ccache
    # Same cache hits from every temporary copy. CCACHE_DIR is pinned because
    # debhelper (compat 13) points HOME at a throwaway directory during the
    # build, which would give ccache an empty cache each time.
    export CCACHE_BASEDIR="$work" CCACHE_NOHASHDIR=true
    CCACHE_DIR=${CCACHE_DIR:-$(ccache -k cache_dir)}
    export CCACHE_DIR
  fi
  echo "build-packages: building hvtrace $version for $suite in $work (log: $out/build.log)" >&2
  if ! (cd "$build/hvtrace-$version" &&
        HVTRACE_LAUNCHER=$launcher DEB_BUILD_OPTIONS=$jobs dpkg-buildpackage -b -us -uc) >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log" >&2
    die "dpkg-buildpackage failed; full log in $out/build.log"
  fi
else
  build_root "$work/lower"
  lower=$(readlink -f "$work/lower")
  ccache_dir=${HVTRACE_CCACHE_DIR:-${HVTRACE_CACHE_DIR:-${HOME:-/root}/.cache/hvtrace}/ccache-$suite}
  mkdir -p "$ccache_dir"
  echo "build-packages: building hvtrace $version for $suite in a $suite root (log: $out/build.log)" >&2
  # The cached root stays untouched (tests/tools/debian-root-run.sh: a
  # throwaway overlay in a private mount namespace). The copy of the tree is
  # /build/hvtrace-VERSION inside, at every run (ccache's key); CCACHE_DIR
  # is pinned because debhelper points HOME elsewhere.
  if ! "$src/tests/tools/debian-root-run.sh" "$lower" \
      --bind "$work/build:/build" --bind "$ccache_dir:/ccache" \
      --env HVTRACE_LAUNCHER=ccache --env CCACHE_DIR=/ccache --env CCACHE_BASEDIR=/build \
      --env CCACHE_NOHASHDIR=true --env CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-2G}" \
      --env DEB_BUILD_OPTIONS="$jobs" \
      -- sh -c "cd /build/hvtrace-$version && dpkg-buildpackage -b -us -uc && ccache -s" \
      >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log" >&2
    die "dpkg-buildpackage in the $suite root failed; full log in $out/build.log"
  fi
fi
rm -f "$out"/*.deb "$out"/*.changes "$out"/*.buildinfo
for f in "$build"/*.deb "$build"/*.changes "$build"/*.buildinfo; do
  [ -e "$f" ] && cp "$f" "$out/"
done
for d in "${debs[@]}"; do
  [ -f "$d" ] || die "$d was not built"
done
echo "$suite" >"$out/suite"
echo "$stamp" >"$out/.stamp"
printf '%s\n' "${debs[@]}"
