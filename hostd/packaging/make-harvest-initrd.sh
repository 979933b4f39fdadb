#!/bin/sh
# Builds the harvest initramfs of the hvtrace package at package build time
# (debian/rules): Debian's static busybox (busybox-static, /bin/busybox) with
# its applet links and harvest-init as /init, a gzip'd newc cpio owned by
# root. No kernel modules: one image serves every kernel that has virtio_pci
# and virtio_console built in (hvtraced harvests the formats of whatever
# kernel a VM runs).
#
#   hostd/packaging/make-harvest-initrd.sh OUT.img
#
# Reproducible: sorted entries, mtimes at $SOURCE_DATE_EPOCH (dpkg sets it
# from debian/changelog), gzip -n.
set -eu
out=${1:?usage: make-harvest-initrd.sh OUT.img}
here=$(cd "$(dirname "$0")" && pwd)
busybox=${HVTRACE_BUSYBOX:-/bin/busybox}
[ -x "$busybox" ] || { echo "make-harvest-initrd: no $busybox (install busybox-static)" >&2; exit 1; }
# A dynamically linked busybox (package busybox) cannot run alone in the
# initramfs.
if LC_ALL=C readelf -l "$busybox" 2>/dev/null | grep -q 'program interpreter'; then
  echo "make-harvest-initrd: $busybox is dynamically linked; install busybox-static" >&2
  exit 1
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/sbin" "$stage/usr/bin" "$stage/usr/sbin" "$stage/proc" \
  "$stage/sys" "$stage/dev" "$stage/tmp" "$stage/root" "$stage/etc"
chmod 1777 "$stage/tmp"
cp "$busybox" "$stage/bin/busybox"
chmod 0755 "$stage/bin/busybox"
# Applet links from the busybox shipped, so every applet it has is there
# (the harvest uses sh, cat, grep, tar, wc, mkdir, rm, uname, mount).
"$busybox" --list-full | while IFS= read -r f; do
  case "$f" in
    bin/busybox) ;;
    bin/*) ln -sf busybox "$stage/$f" ;;
    sbin/*) ln -sf ../bin/busybox "$stage/$f" ;;
    usr/bin/* | usr/sbin/*) ln -sf ../../bin/busybox "$stage/$f" ;;
  esac
done
install -m 0755 "$here/harvest-init" "$stage/init"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$stage/etc/passwd"
printf 'root:x:0:\n' >"$stage/etc/group"
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
  find "$stage" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
fi
mkdir -p "$(dirname "$out")"
(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort |
  cpio --quiet -o -H newc -R 0:0 --reproducible) | gzip -9 -n >"$out.tmp"
mv "$out.tmp" "$out"
