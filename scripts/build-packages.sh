#!/usr/bin/env bash
# Builds the Debian packages hvtrace, hvtrace-agent and libdwtrace-dev from
# the current tree (committed and uncommitted changes to tracked files; new
# files that are not `git add`ed are left out) into OUTDIR, and prints their
# paths.
#
#   scripts/build-packages.sh OUTDIR
#
# The tree stays clean: the tracked files are copied to a temporary directory
# and dpkg-buildpackage -b -us -uc runs there. Cheap to rerun: OUTDIR/.stamp
# holds the hash of the tracked files' contents (so a commit that changes no
# file does not rebuild); when it matches and the .debs are there, nothing is
# built. ccache is used when installed; the copy is always at the same path
# (${TMPDIR:-/tmp}/hvtrace-pkg-build, under a lock) so that the compiler's
# -ffile-prefix-map argument, and with it ccache's key, stays the same.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
mkdir -p "$1"
out=$(cd "$1" && pwd)

version=$(dpkg-parsechangelog -l "$src/debian/changelog" -S Version)
arch=$(dpkg --print-architecture)
debs=("$out/hvtrace_${version}_${arch}.deb" "$out/hvtrace-agent_${version}_${arch}.deb"
      "$out/libdwtrace-dev_${version}_${arch}.deb")

tree_hash() {  # the index (modes, blob ids, names) + unstaged edits of tracked files
  (cd "$src" && git ls-files -s && git diff --binary) | sha256sum | cut -d' ' -f1
}
stamp=$(tree_hash)

have_all=1
for d in "${debs[@]}"; do [ -f "$d" ] || have_all=0; done
if [ "$have_all" = 1 ] && [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ]; then
  echo "build-packages: up to date (tree $stamp)" >&2
  printf '%s\n' "${debs[@]}"
  exit 0
fi

work="${TMPDIR:-/tmp}/hvtrace-pkg-build"
mkdir -p "$work"
exec 9>"$work.lock"
flock 9
trap 'rm -rf "$work"' EXIT
rm -rf "${work:?}"/*
mkdir "$work/hvtrace-$version"
# Tracked files as they are in the work tree (including uncommitted edits).
git -C "$src" ls-files -z --cached | (cd "$src" && xargs -0 cp -P --parents -t "$work/hvtrace-$version" 2>/dev/null || true)
# Files deleted in the work tree but still tracked are skipped by cp; check
# that the copy has what debian/ needs.
[ -f "$work/hvtrace-$version/debian/rules" ] || { echo "build-packages: debian/rules missing from the copy" >&2; exit 1; }

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
echo "build-packages: building hvtrace $version in $work (log: $out/build.log)" >&2
if ! (cd "$work/hvtrace-$version" &&
      HVTRACE_LAUNCHER=$launcher DEB_BUILD_OPTIONS="parallel=${HVTRACE_JOBS:-2} ${DEB_BUILD_OPTIONS:-}" \
        dpkg-buildpackage -b -us -uc) >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log" >&2
  echo "build-packages: dpkg-buildpackage failed; full log in $out/build.log" >&2
  exit 1
fi
rm -f "$out"/*.deb "$out"/*.changes "$out"/*.buildinfo
for f in "$work"/*.deb "$work"/*.changes "$work"/*.buildinfo; do
  [ -e "$f" ] && cp "$f" "$out/"
done
for d in "${debs[@]}"; do
  [ -f "$d" ] || { echo "build-packages: $d was not built" >&2; exit 1; }
done
echo "$stamp" >"$out/.stamp"
printf '%s\n' "${debs[@]}"
