// Harvesting a kernel's tracefs formats without an agent: boot the kernel
// briefly in a throwaway TCG VM, copy its formats out, check them on the host
// and store them in the FormatCache under the kernel image's SHA-256.
//
// The data channel is a virtio-serial port (virtserialport named
// org.hvtrace.harvest, backed by a host file): the guest writes one tar
// archive to /dev/vportNpM with `cat`. It needs no module in Debian's 6.12
// kernel (CONFIG_VIRTIO_PCI=y, CONFIG_VIRTIO_CONSOLE=y) and moved the ~10 MB
// archive in 0.4 s here, where the second UART managed ~100 KB/s (and
// translated newlines) and an ivshmem BAR cannot be written with the shell's
// tools (sysfs resource files of memory BARs only mmap). Kernels that build
// virtio as modules (Debian's 6.1) need an initrd that loads virtio_pci and
// virtio_console (build-guest.sh: HVTRACE_GUEST_EXTRA_MODULES); the harvest
// says so when the port does not appear.
//
// Commands reach the guest over its serial console (the guest contract in
// qemu-scripts/README.md), so any initrd that follows the contract works.
#ifndef HVTRACE_HOSTD_FORMATS_HARVEST_H_
#define HVTRACE_HOSTD_FORMATS_HARVEST_H_

#include <chrono>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

struct HarvestOptions {
  std::string kernel;  // vmlinuz
  // What the entry's manifest records as the kernel's path and errors name
  // (hvtraced: the client's path, not its private copy); empty: |kernel|.
  std::string kernel_label;
  std::string initrd;                // An initramfs following the guest contract.
  std::filesystem::path cache_root;  // FormatCache root (holds formats/).
  std::string qemu_binary = "qemu-system-x86_64";
  std::chrono::milliseconds boot_timeout = std::chrono::seconds(180);
  std::chrono::milliseconds command_timeout = std::chrono::seconds(120);
  // Keep the VM's work directory (console log, QEMU log, the archive).
  bool keep_work_dir = false;
  // Called with one line per step, e.g. to print progress; may be empty.
  std::function<void(std::string_view)> progress;
};

struct HarvestResult {
  std::string key;
  std::filesystem::path entry_dir;
  bool cache_hit = false;
  nlohmann::json manifest;
  double seconds = 0;  // Wall time of this call.
};

// The harvest initramfs the hvtrace package installs (debian/rules,
// hostd/packaging/make-harvest-initrd.sh): busybox-static and a /init that
// follows the guest contract, no modules.
inline constexpr const char* kPackagedHarvestInitrd = "/usr/lib/hvtrace/harvest-initrd.img";

// The initramfs hvtraced harvests with: |configured| (config harvest_initrd)
// when set, else guest/6.12/initrd.img beside the directory of the running
// binary (build/bin/hvtraced → build/guest/6.12/initrd.img, what
// qemu-scripts/build-guest.sh makes) when it exists, else the package's
// kPackagedHarvestInitrd when it exists; else empty.
std::filesystem::path ResolveHarvestInitrd(const std::filesystem::path& configured);

// Returns the cache entry for |options.kernel|, harvesting it first when the
// cache has none. Errors say which step failed and carry the guest console's
// tail.
Result<HarvestResult> HarvestFormats(const HarvestOptions& options);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FORMATS_HARVEST_H_
