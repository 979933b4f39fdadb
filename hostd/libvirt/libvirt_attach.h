// Attach mode for libvirt domains: hot-plug an ivshmem-plain region and take
// it away again (DESIGN §4.3, §4.4).
//
// Attach: checks the shm name, the domain (running, a hot-pluggable PCI bus:
// pc with ACPI, or q35 with a free root port), and /dev/shm/<name>: libvirt
// never deletes these files, so one left by an earlier run is "stale" —
// refused unless the caller asks to replace it, while a file some process
// still maps is never touched. Then virDomainAttachDeviceFlags(AFFECT_LIVE)
// with the alias "ua-hvtrace-<name>", and the DEVICE_ADDED event for that
// alias is awaited; only then is the file looked at (size, owner: QEMU may
// run as another user, e.g. libvirt-qemu).
//
// Detach: virDomainDetachDeviceAlias, then DEVICE_REMOVED for the alias is
// the only proof it happened (libvirt reports success after a 5 s timeout
// when the guest never releases the device). The file is left in place.
//
// These calls block waiting for libvirt events: never call them on the
// libvirt event loop's thread (they refuse).
#ifndef HVTRACE_HOSTD_LIBVIRT_ATTACH_H_
#define HVTRACE_HOSTD_LIBVIRT_ATTACH_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "hvtrace/result.h"
#include "libvirt_client.h"

namespace hvtrace::hostd {

struct ShmemAttachRequest {
  std::string domain;    // Name or UUID.
  std::string shm_name;  // /dev/shm/<shm_name>.
  uint64_t size_bytes = 4ull << 20;
  bool replace_stale = false;
  // The caller (hvtraced) has just created the file with the region header,
  // sized |size_bytes|, and maps it itself: it is not stale, keep it.
  bool prepared_file = false;
  std::chrono::milliseconds timeout{10000};
  std::filesystem::path shm_dir = "/dev/shm";
};

struct ShmemAttachment {
  std::string domain_name;
  std::string domain_uuid;
  std::string shm_name;
  std::string alias;
  std::filesystem::path path;
  uint64_t size_bytes = 0;
  uid_t owner_uid = 0;
  gid_t owner_gid = 0;
  double attach_ms = 0;    // virDomainAttachDeviceFlags → DEVICE_ADDED.
  std::string stale_note;  // What was done about a stale file, if any.
};

// The alias hvtrace gives the shmem device named |shm_name|.
std::string ShmemAlias(const std::string& shm_name);

// Who maps |path| (pid and comm), from /proc/*/maps; nullopt when nobody.
std::optional<std::string> FindMapper(const std::filesystem::path& path);

Result<ShmemAttachment> AttachShmem(const std::shared_ptr<LibvirtClient>& client,
                                    const ShmemAttachRequest& request);

Status DetachShmem(const std::shared_ptr<LibvirtClient>& client, const std::string& domain,
                   const std::string& shm_name,
                   std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_LIBVIRT_ATTACH_H_
