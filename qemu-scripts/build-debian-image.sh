#!/usr/bin/env bash
# Builds the Debian test VMs: a bootable qcow2 disk image made from Debian's
# packages, the way a user's distro VM looks (its kernel and initrd live in the
# image, the host never holds them).
#
#   qemu-scripts/build-debian-image.sh [--suite bookworm|trixie] [--out DIR] [--agent PATH | --agent-deb DEB] [--refresh]
#   qemu-scripts/build-debian-image.sh [--suite bookworm|trixie] --root-only
#
# --suite picks the release and its kernel (default bookworm):
#   bookworm  Debian 12, the bookworm-backports linux-image-6.12.*-amd64 that
#             build-guest.sh resolves for --kernel 6.12; output DIR/debian12/
#   trixie    Debian 13, the trixie-backports linux-image-7.3.*-amd64 that
#             build-guest.sh resolves for --kernel 7.3 (a meta package: the
#             kernel is in linux-binary-REL at /usr/lib/modules/REL/vmlinuz,
#             the modules in linux-modules-REL); output DIR/debian13/
#
# Image: MBR disk, partition 1 FAT32 /boot (syslinux, the kernel, Debian's
# initramfs-tools initrd), partition 2 ext4 / (read-write); systemd; console
# on ttyS0; trace-cmd and kexec-tools. The hvtrace agent is installed
# as a user installs it: with --agent-deb, its package (scripts/build-packages.sh)
# is copied into the root and `dpkg -i`ed there (the .deb stays in /root for the README's
# guest step), so its postinst enables the
# unit and rebuilds the initramfs with its hook; with --agent (developers, the
# default), the binary at /usr/sbin/hvtrace-agent, guest-agent/dist/'s unit
# (enabled) and initramfs-tools hook + scripts in /etc (update-initramfs ran). A test
# fixture, hvtrace-demo-marker.service (qemu-scripts/debian/), writes one
# trace_marker line at boot; another gives the serial console a root shell
# that prints HVTRACE-GUEST-READY (how tests type commands into the guest).
#
# Needs root (mmdebstrap's root mode runs the packages' scripts in a chroot),
# no loop devices and no mounts outside mmdebstrap's private namespace:
# mmdebstrap -> tarball, mkfs.ext4 -d and mkfs.vfat + mtools + syslinux
# --install on partition files, sfdisk + syslinux's MBR on the disk file.
#
# Cache (${HVTRACE_CACHE_DIR:-$HOME/.cache/hvtrace}/debian-image/GUEST/, one
# directory and one lock per image, so both suites build at the same time
# and neither evicts the other), two levels:
#   root-KEY.tar   the installed package root, KEY = package list + suite +
#                  kernel + mirror + the root recipe (build_root below)
#   image-KEY.qcow2  the final image, KEY adds the agent binary and the dist
#                  files (or the agent .deb), the fixture and this script
#   debs/          the last root's .debs, so a rebuilt root fetches only what changed
# A new agent only redoes the image step; --root-only makes (or finds) the
# package root and stops (tests/run.sh fetches it beside its compile). Output: DIR/GUEST/disk.qcow2
# (DIR defaults to build/guest; a hard link to the cached image), plus
# kernel-release, package and cmdline. Prints
#   IMAGE GUEST DISK=<abs path> RELEASE=<uname -r>
# Boot it with snapshot=on (or an overlay): never write the cached image.
#
# Exit status 75 (EX_TEMPFAIL): offline, Debian's archive could not be reached
# (name resolution or connection failed) and nothing is cached; tests skip on
# it, and tests/run.sh reports a skip, or a failure with CI=true (CI must
# reach the archive). Any other failure, a fetch that failed for another
# reason (404, hash sum mismatch) included, is an error: exit 1.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
CACHE=${HVTRACE_CACHE_DIR:-${HOME:-/root}/.cache/hvtrace}
OUT="$ROOT/build/guest"
AGENT="$ROOT/build/bin/hvtrace-agent"
AGENT_DEB=""
REFRESH=0
ROOT_ONLY=0
SUITE=bookworm
# Fixed identifiers, so the boot loader and fstab can name the filesystems.
ROOT_UUID=5d1c7f0e-4a52-4f3b-9c1e-68b7a0c1e212
BOOT_VOLID=4856540C  # FAT volume id; udev names it 4856-540C (upper case)
BOOT_MIB=256
ROOT_MIB=3072
# Beyond the essentials: what the later e2e tests run inside the guest.
# zstd: initramfs-tools recommends it and compresses with it by default.
# dbus: systemd-logind needs it, and logind turns the ACPI power button (QMP
# system_powerdown, `virsh shutdown`) into a clean poweroff.
PACKAGES=(systemd-sysv udev dbus kmod initramfs-tools zstd e2fsprogs dosfstools trace-cmd kexec-tools
  procps)

log() { echo "build-debian-image: $*" >&2; }
die() { echo "build-debian-image: error: $*" >&2; exit 1; }
usage() { sed -n '6,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --suite) [ $# -ge 2 ] || usage; SUITE=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
    --agent) [ $# -ge 2 ] || usage; AGENT=$2; shift 2 ;;
    --agent-deb) [ $# -ge 2 ] || usage; AGENT_DEB=$2; shift 2 ;;
    --refresh) REFRESH=1; shift ;;
    --root-only) ROOT_ONLY=1; shift ;;
    -h|--help) usage ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

# The image name and the build-guest.sh kernel of each suite. KERNEL_DEPS:
# what the kernel needs from backports beyond itself. apt takes a backports
# package only when named (NotAutomatic), and trixie-backports' 7.x image
# package pre-depends on linux-base >= 4.17, which trixie itself lacks.
KERNEL_DEPS=()
case "$SUITE" in
  bookworm) GUEST=debian12; KERNEL_GUEST=6.12 ;;
  trixie) GUEST=debian13; KERNEL_GUEST=7.3; KERNEL_DEPS=(linux-base/trixie-backports) ;;
  *) die "--suite takes bookworm or trixie, not '$SUITE'" ;;
esac
IMG_CACHE="$CACHE/debian-image/$GUEST"

[ "$(id -u)" -eq 0 ] || die "needs root (mmdebstrap installs the packages in a chroot)"
for tool in mmdebstrap mkfs.ext4 mkfs.vfat mcopy syslinux sfdisk qemu-img tar sha256sum flock; do
  command -v "$tool" >/dev/null || die "'$tool' is missing; run scripts/install-deps.sh"
done
SYSLINUX_MBR=/usr/lib/syslinux/mbr/mbr.bin
[ -f "$SYSLINUX_MBR" ] || die "$SYSLINUX_MBR is missing (package syslinux-common)"
if [ "$ROOT_ONLY" = 1 ]; then
  :  # No agent in the package root.
elif [ -n "$AGENT_DEB" ]; then
  [ -f "$AGENT_DEB" ] || die "agent package $AGENT_DEB is missing (scripts/build-packages.sh builds it)"
  AGENT_DEB=$(cd "$(dirname "$AGENT_DEB")" && pwd)/$(basename "$AGENT_DEB")
  [ "$(dpkg-deb -f "$AGENT_DEB" Package 2>/dev/null)" = hvtrace-agent ] ||
    die "$AGENT_DEB is not an hvtrace-agent package"
else
  [ -f "$AGENT" ] || die "agent binary $AGENT is missing (build the hvtrace-agent target first)"
  AGENT=$(cd "$(dirname "$AGENT")" && pwd)/$(basename "$AGENT")
  if LC_ALL=C readelf -l "$AGENT" 2>/dev/null | grep -q 'Requesting program interpreter'; then
    die "$AGENT is dynamically linked; the initramfs has no libc for it"
  fi
fi
DIST="$ROOT/guest-agent/dist"
BOOT_PROBES="$ROOT/qemu-scripts/guest/hvtrace-boot-probes"  # The agent package ships it.
FIXTURES="$SCRIPT_DIR/debian"

started=$(date +%s.%N)
mkdir -p "$IMG_CACHE/debs" "$OUT"
OUT=$(cd "$OUT" && pwd)
exec 8>"$IMG_CACHE/.lock"
flock 8

# Exits 75 when log $1 shows that Debian's archive could not be reached. Not
# on a bare "Failed to fetch": apt says that for a 404 or a hash sum mismatch
# too (a stale mirror, a moved package), errors that must not pass for offline.
# apt names the network cause on the same line.
exit_if_offline() {
  if grep -qiE 'Temporary failure (resolving|in name resolution)|Could not resolve|Something wicked happened resolving|Name or service not known|No address associated with hostname|Could not connect|Unable to connect|Network is unreachable|Connection (refused|timed out|failed)|No route to host' \
       "$1"; then
    echo "build-debian-image: offline: cannot reach Debian's archive to fetch the packages and nothing is" \
         "cached; exit 75 (tests on the image skip; with CI=true tests/run.sh fails); see $1" >&2
    exit 75
  fi
}
# The kernel: the same backports package the initramfs guests use, as
# build-guest.sh resolved it from the signed lists (its lock serializes two
# image builds that both resolve).
if [ ! -f "$CACHE/resolved-$KERNEL_GUEST" ] || [ "$REFRESH" -eq 1 ]; then
  refresh=(); [ "$REFRESH" -eq 0 ] || refresh=(--refresh)
  if ! "$SCRIPT_DIR/build-guest.sh" --kernel "$KERNEL_GUEST" "${refresh[@]}" \
       >"$IMG_CACHE/build-guest.log" 2>&1; then
    cat "$IMG_CACHE/build-guest.log" >&2
    exit_if_offline "$IMG_CACHE/build-guest.log"
    die "build-guest.sh --kernel $KERNEL_GUEST failed"
  fi
fi
# Line 1 is "NAME VERSION ...": the linux-image package (for 7.x the meta
# package; apt installs the linux-binary and linux-modules it depends on).
read -r KPKG KVERSION _ <"$CACHE/resolved-$KERNEL_GUEST" ||
  die "no kernel resolved in $CACHE/resolved-$KERNEL_GUEST"

# The mirror apt on the host uses, the same choice build-guest.sh makes.
uris=$(cat "$CACHE/apt/hvtrace.sources" 2>/dev/null | sed -n 's/^URIs: //p' || true)
MIRROR=$(echo "$uris" | sed -n 1p)
MIRROR=${HVTRACE_DEBIAN_MIRROR:-${MIRROR:-http://deb.debian.org/debian}}
SECURITY_MIRROR=$(echo "$uris" | sed -n 2p)
SECURITY_MIRROR=${HVTRACE_DEBIAN_SECURITY_MIRROR:-${SECURITY_MIRROR:-http://deb.debian.org/debian-security}}

# Stage 1: the package root. Everything that shapes it is in this function or
# its arguments, and the cache key hashes both.
build_root() {  # build_root DEST.tar
  local dest=$1 include=("${PACKAGES[@]}" "${KERNEL_DEPS[@]}" "$KPKG=$KVERSION")
  # The kernel's postinst runs update-initramfs (initramfs-tools defaults:
  # MODULES=most, so the initrd boots from virtio, SATA or SCSI disks).
  # kexec-tools would turn every reboot into a kexec (LOAD_KEXEC=true); a
  # reboot stays a reboot, and `kexec -l` + `systemctl kexec` still work.
  # .debs come from the cache and go back to it (mmdebstrap's documented
  # recipe); only those of this root are kept.
  mmdebstrap --mode=root --variant=minbase --architectures=amd64 \
    --include="$(IFS=,; echo "${include[*]}")" \
    --aptopt='Acquire::Retries "3"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt=force-unsafe-io \
    --skip=download/empty --skip=essential/unlink \
    --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
    --setup-hook="sync-in '$IMG_CACHE/debs' /var/cache/apt/archives/" \
    --customize-hook="sync-out /var/cache/apt/archives '$IMG_CACHE/debs.new'" \
    --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb' \
    --customize-hook='echo hvtrace-debian >"$1/etc/hostname"' \
    --customize-hook='sed -i "s/^LOAD_KEXEC=true/LOAD_KEXEC=false/" "$1/etc/default/kexec"' \
    --customize-hook='echo "127.0.1.1 hvtrace-debian" >>"$1/etc/hosts"' \
    "$SUITE" "$dest" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
    "deb $MIRROR $SUITE-backports main" "deb $SECURITY_MIRROR $SUITE-security main"
}

root_key=$( { declare -f build_root; printf '%s\n' "${PACKAGES[@]}" "$SUITE" "${KERNEL_DEPS[@]}" "$KPKG" "$KVERSION" "$MIRROR" \
  "$SECURITY_MIRROR"; } | sha256sum | cut -c1-16)
ROOT_TAR="$IMG_CACHE/root-$root_key.tar"
if [ ! -f "$ROOT_TAR" ]; then
  log "installing the package root ($KPKG $KVERSION + ${PACKAGES[*]}) from $MIRROR"
  t0=$(date +%s)
  rm -rf "$ROOT_TAR.tmp.tar" "$IMG_CACHE/debs.new"
  mkdir "$IMG_CACHE/debs.new"
  if ! build_root "$ROOT_TAR.tmp.tar" >"$IMG_CACHE/mmdebstrap.log" 2>&1; then
    tail -n 30 "$IMG_CACHE/mmdebstrap.log" >&2
    rm -rf "$ROOT_TAR.tmp.tar" "$IMG_CACHE/debs.new"
    exit_if_offline "$IMG_CACHE/mmdebstrap.log"
    die "mmdebstrap failed (see $IMG_CACHE/mmdebstrap.log)"
  fi
  mv "$ROOT_TAR.tmp.tar" "$ROOT_TAR"
  rm -rf "$IMG_CACHE/debs" && mv "$IMG_CACHE/debs.new" "$IMG_CACHE/debs"
  log "package root installed in $(( $(date +%s) - t0 )) s"
fi
[ "$ROOT_ONLY" = 0 ] || { log "package root $ROOT_TAR"; exit 0; }

# Stage 2: the image, from the root plus the agent and its files.
image_key=$( {
  echo "$root_key"
  sha256sum "$0" "$FIXTURES"/* | cut -d' ' -f1
  if [ -n "$AGENT_DEB" ]; then
    echo "agent-deb $(sha256sum <"$AGENT_DEB" | cut -d' ' -f1)"
  else
    sha256sum "$AGENT" | cut -d' ' -f1
    (cd "$DIST" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum)
    (cd "$DIST" && find . -printf '%p %m\n' | LC_ALL=C sort)
    sha256sum "$BOOT_PROBES" | cut -d' ' -f1
  fi
} | sha256sum | cut -c1-16)
IMAGE="$IMG_CACHE/image-$image_key.qcow2"
RELEASE_FILE="$IMG_CACHE/image-$image_key.release"
CMDLINE="root=UUID=$ROOT_UUID rw console=ttyS0"

# The unpacked root with the agent, the fixtures, fstab and an initramfs
# that holds the agent.
stage_root() {  # stage_root ROOTFS RELEASE
  local rootfs=$1 release=$2
  mkdir -p "$rootfs"
  tar -C "$rootfs" --numeric-owner -xpf "$ROOT_TAR"
  [ -d "$rootfs/usr/lib/modules/$release" ] || die "the package root has no modules of $release"

  if [ -z "$AGENT_DEB" ]; then
    # The agent from the build tree (files + unit, as a developer installs it).
    install -m 0755 "$AGENT" "$rootfs/usr/sbin/hvtrace-agent"
    install -m 0644 "$DIST/hvtrace-agent.service" "$rootfs/etc/systemd/system/"
    install -m 0755 "$DIST/initramfs-tools/hooks/hvtrace-agent" "$rootfs/etc/initramfs-tools/hooks/"
    install -m 0755 "$DIST/initramfs-tools/scripts/init-top/hvtrace-agent" \
      "$rootfs/etc/initramfs-tools/scripts/init-top/"
    install -m 0755 "$DIST/initramfs-tools/scripts/init-bottom/hvtrace-agent" \
      "$rootfs/etc/initramfs-tools/scripts/init-bottom/"
    # Where the package puts it (guest-agent/CMakeLists.txt).
    install -D -m 0755 "$BOOT_PROBES" "$rootfs/usr/libexec/hvtrace/hvtrace-boot-probes"
  fi
  # The test fixtures: the demo marker service, a root shell on ttyS0.
  install -m 0644 "$FIXTURES/hvtrace-demo-marker.service" "$rootfs/etc/systemd/system/"
  install -D -m 0644 "$FIXTURES/serial-getty-autologin.conf" \
    "$rootfs/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf"
  install -m 0644 "$FIXTURES/root-profile" "$rootfs/root/.profile"

  cat >"$rootfs/etc/fstab" <<EOF
# <file system>      <mount point> <type> <options>                 <dump> <pass>
UUID=$ROOT_UUID      /             ext4   errors=remount-ro         0      1
UUID=${BOOT_VOLID:0:4}-${BOOT_VOLID:4:4}   /boot         vfat   umask=0077,shortname=winnt 0      2
EOF
  # Empty, not "uninitialized": every boot of a snapshot=on image would
  # otherwise be a systemd first boot (presets applied again).
  : >"$rootfs/etc/machine-id"
  if [ -n "$AGENT_DEB" ]; then
    # The package, as a user installs it: its postinst enables the unit and
    # runs update-initramfs (the hook puts the agent into the initrd).
    cp "$AGENT_DEB" "$rootfs/tmp/hvtrace-agent.deb"
    chroot "$rootfs" dpkg -i /tmp/hvtrace-agent.deb >&2
    # The README's guest step installs it from root's home, "copied from
    # the host's build-packages.sh output" (tests/service/libvirt_readme_test.sh).
    mv "$rootfs/tmp/hvtrace-agent.deb" "$rootfs/root/$(basename "$AGENT_DEB")"
    chroot "$rootfs" systemctl enable hvtrace-demo-marker.service >&2
    [ "$(chroot "$rootfs" systemctl is-enabled hvtrace-agent.service)" = enabled ] ||
      die "the hvtrace-agent package left its unit disabled"
    chroot "$rootfs" lsinitramfs "/boot/initrd.img-$release" | grep -qx 'usr/sbin/hvtrace-agent' ||
      die "the hvtrace-agent package's postinst left no agent in /boot/initrd.img-$release"
  else
    chroot "$rootfs" systemctl enable hvtrace-agent.service hvtrace-demo-marker.service >&2
    chroot "$rootfs" update-initramfs -u -k "$release" >&2
  fi
  # Last, after every package, as a first boot leaves them: systemd-update-
  # done's stamps, newer than /usr. Without them ldconfig, the journal
  # catalog update and update-done (ConditionNeedsUpdate) ran on every boot
  # of the snapshot=on image: 6.6 s of the 7.3 image's critical chain to
  # multi-user under TCG (systemd-analyze critical-chain, 2026-11-29).
  touch "$rootfs/etc/.updated" "$rootfs/var/.updated"
}

# Moves /boot to the boot partition's tree and writes syslinux's config.
stage_boot() {  # stage_boot ROOTFS BOOTFS RELEASE
  local rootfs=$1 bootfs=$2 release=$3
  [ -f "$rootfs/boot/initrd.img-$release" ] ||
    die "update-initramfs left no /boot/initrd.img-$release in the package root"
  # The root keeps an empty /boot to mount the partition on.
  mkdir -p "$bootfs"
  mv "$rootfs/boot"/* "$bootfs"/
  # syslinux reads only that partition, and FAT holds no symlinks: the kernel
  # file itself must be there. A 6.12 package installs /boot/vmlinuz-REL; a
  # 7.x one (linux-binary-REL) only /usr/lib/modules/REL/vmlinuz, copied
  # here (the root keeps its own, where the package owns it).
  if [ -L "$bootfs/vmlinuz-$release" ] || [ ! -e "$bootfs/vmlinuz-$release" ]; then
    [ -f "$rootfs/usr/lib/modules/$release/vmlinuz" ] ||
      die "the package root has neither /boot/vmlinuz-$release nor /usr/lib/modules/$release/vmlinuz"
    rm -f "$bootfs/vmlinuz-$release"
    cp "$rootfs/usr/lib/modules/$release/vmlinuz" "$bootfs/vmlinuz-$release"
  fi
  mkdir -p "$bootfs/syslinux"
  cat >"$bootfs/syslinux/syslinux.cfg" <<EOF
# Debian test image $GUEST (qemu-scripts/build-debian-image.sh). The guest sees this
# file as /boot/syslinux/syslinux.cfg; kernel parameters go on the APPEND line.
SERIAL 0 115200
DEFAULT debian
PROMPT 0
TIMEOUT 0
LABEL debian
  LINUX /vmlinuz-$release
  INITRD /initrd.img-$release
  APPEND $CMDLINE
EOF
}

# The disk from the staged trees: FAT /boot and ext4 / as partition files,
# laid into a raw MBR disk, converted to $stage/image.qcow2.
make_disk() {  # make_disk STAGE
  local stage=$1 rootfs="$1/root" bootfs="$1/boot"
  local disk="$stage/disk.raw" boot_img="$stage/boot.fat" root_img="$stage/root.ext4"
  truncate -s "${BOOT_MIB}M" "$boot_img"
  mkfs.vfat -F 32 -n HVBOOT -i "$BOOT_VOLID" "$boot_img" >/dev/null
  mcopy -i "$boot_img" -s -p -m "$bootfs"/* ::/
  syslinux --install --directory /syslinux "$boot_img"
  # -d copies owners, modes, links and device nodes from the directory.
  mkfs.ext4 -q -L hvtrace-root -U "$ROOT_UUID" -d "$rootfs" "$root_img" "${ROOT_MIB}M"

  truncate -s $((1 + BOOT_MIB + ROOT_MIB))M "$disk"
  sfdisk -q "$disk" <<EOF
label: dos
unit: sectors
start=2048, size=$((BOOT_MIB * 2048)), type=c, bootable
start=$((2048 + BOOT_MIB * 2048)), size=$((ROOT_MIB * 2048)), type=83
EOF
  dd if="$SYSLINUX_MBR" of="$disk" bs=440 count=1 conv=notrunc status=none
  dd if="$boot_img" of="$disk" bs=1M seek=1 conv=notrunc,sparse status=none
  dd if="$root_img" of="$disk" bs=1M seek=$((1 + BOOT_MIB)) conv=notrunc,sparse status=none
  qemu-img convert -q -f raw -O qcow2 "$disk" "$stage/image.qcow2"
}

build_image() {  # build_image STAGE: writes STAGE/image.qcow2 and STAGE/release
  # The release is the image package's name (linux-image-REL, meta or not).
  local stage=$1 release=${KPKG#linux-image-}
  stage_root "$stage/root" "$release"
  stage_boot "$stage/root" "$stage/boot" "$release"
  make_disk "$stage"
  echo "$release" >"$stage/release"
}

if [ ! -f "$IMAGE" ] || [ ! -f "$RELEASE_FILE" ]; then
  log "building the image (agent ${AGENT_DEB:-$AGENT})"
  t0=$(date +%s)
  stage=$(mktemp -d "$IMG_CACHE/.stage.XXXXXX")
  trap 'rm -rf "$stage"' EXIT
  build_image "$stage"
  mv "$stage/release" "$RELEASE_FILE"
  chmod 0444 "$stage/image.qcow2"  # A reminder: boot it with snapshot=on.
  mv "$stage/image.qcow2" "$IMAGE"
  rm -rf "$stage"
  trap - EXIT
  log "image built in $(( $(date +%s) - t0 )) s"
fi
RELEASE=$(cat "$RELEASE_FILE")

# Older roots and images leave the cache (this runs under the lock).
for f in "$IMG_CACHE"/root-*.tar "$IMG_CACHE"/image-*.qcow2 "$IMG_CACHE"/image-*.release; do
  [ -e "$f" ] || continue
  case "$f" in
    "$ROOT_TAR"|"$IMAGE"|"$RELEASE_FILE") ;;
    *) log "removing unused $f"; rm -f "$f" ;;
  esac
done

dir="$OUT/$GUEST"
mkdir -p "$dir"
# A hard link when the cache is on the same filesystem (no copy of ~1 GB),
# replaced by rename so a running QEMU keeps its file.
if [ ! "$IMAGE" -ef "$dir/disk.qcow2" ]; then
  ln -f "$IMAGE" "$dir/disk.qcow2.tmp" 2>/dev/null || cp "$IMAGE" "$dir/disk.qcow2.tmp"
  mv -f "$dir/disk.qcow2.tmp" "$dir/disk.qcow2"
fi
echo "$RELEASE" >"$dir/kernel-release"
echo "$KPKG $KVERSION" >"$dir/package"
echo "$CMDLINE" >"$dir/cmdline"
log "done in $(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f s", e - s }')"
echo "IMAGE $GUEST DISK=$dir/disk.qcow2 RELEASE=$RELEASE"
