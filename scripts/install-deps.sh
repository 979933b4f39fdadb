#!/usr/bin/env bash
# Installs hvtrace's build and test dependencies from Debian's packages.
# Idempotent and fast when everything is already present: it only calls apt
# when a package is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  # libclang-rt-dev: the sanitizer runtimes of the default clang (14 on
  # bookworm, 19 on trixie, which has no libclang-rt-14-dev). llvm: its
  # llvm-symbolizer names a sanitizer report's frames, and LeakSanitizer's
  # suppressions (tests/unit/lsan_suppressions.cc) match those names; a fresh
  # Debian 13 has none, and libtracecmd's known leak then failed the run.
  clang libclang-rt-dev clang-format lld llvm
  libboost-dev libboost-system-dev
  nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libvirt-dev libvirt-daemon-system libvirt-clients
  libtraceevent-dev libtracefs-dev libtracecmd-dev trace-cmd
  libzstd-dev zlib1g-dev nettle-dev
  qemu-system-x86 qemu-utils
  # busybox-static, cpio: the guests' initramfs, and the hvtrace package's
  # harvest initramfs (debian/control Build-Depends).
  busybox-static cpio zstd xz-utils gzip kmod
  # Test modules built against the guest kernel's headers (build-test-modules.sh):
  # gcc-12 for bookworm's kernels; a kernel of another release is built in a
  # root of that release (mmdebstrap, tests/tools/debian-root.sh).
  make gcc-12
  mmdebstrap syslinux syslinux-common mtools dosfstools fdisk e2fsprogs
  liblttng-ust-dev lttng-tools
  python3 socat ccache
  # Packaging (debian/, scripts/build-packages.sh, tests/packaging/).
  scdoc debhelper dpkg-dev fakeroot lintian bash-completion systemd libxml2-dev
  # The service test boots systemd in a container (tests/service/).
  systemd-container
  # Fleet upload (hostd/fleet/): libcurl's SigV4; a single-node Ceph with radosgw in tests,
  # which curl asks (tests/e2e/ceph_fixture.cc: a fresh Debian 13 has no curl).
  libcurl4-openssl-dev ceph-mon ceph-mgr ceph-osd radosgw ceph-common curl
  # protoc --decode_raw checks that `hvtrace show --format perfetto` files are
  # well-formed protobuf (tests/unit/shared/decode/perfetto_writer_test.cc).
  protobuf-compiler
  # A panic capture's vmcore (vmcore = on-panic) checked by makedumpfile --dump-dmesg.
  makedumpfile
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

check_libvirt_user() {
  # libvirt-daemon-system creates it; the system libvirtd runs QEMU as it.
  if ! getent passwd libvirt-qemu >/dev/null; then
    echo "install-deps: user libvirt-qemu is missing although libvirt-daemon-system is installed;" \
         "reinstall it: apt-get install --reinstall libvirt-daemon-system" >&2
    exit 1
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  check_libvirt_user
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
check_libvirt_user
