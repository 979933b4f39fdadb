// What a VM backend hands the capture service for one capture: the host
// file holding the boot range and the attached live region, with what the
// backend knows of the VM. Below both: backends fill it (vm_backend.h), the
// capture service (hostd/capture) copies and decodes what it names.
#ifndef HVTRACE_HOSTD_CAPTURE_INPUTS_H_
#define HVTRACE_HOSTD_CAPTURE_INPUTS_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "guest_ram.h"
#include "hvtrace/result.h"
#include "live_region.h"
#include "region_file.h"

namespace hvtrace::hostd {

// A host file holding a guest-physical range (the boot range, or a raw
// shmem region). The backend keeps |file| open (and mapped) so the bytes
// outlive QEMU; holding it here keeps it open while the capture reads it, as
// a backend may switch to a new file (a restarted libvirt domain) meanwhile.
struct RegionFileSource {
  std::shared_ptr<const RegionFile> file;
  std::filesystem::path path;  // For the manifest and errors.
  uint64_t offset = 0;         // Of the range in the file.
  uint64_t size = 0;           // What hostd configured; never the guest's word.
  uint64_t gpa = 0;
  // false: a raw shmem file with no persistent ring buffer: kept as
  // region.bin, not decoded.
  bool boot_range = true;
  std::string kernel_path;  // The kernel file, when the backend knows it.
  std::string kernel_key;   // Its formats cache key (formats_cache.h).
};

// What a backend hands over for one capture. Cheap to make: no copying.
struct CaptureInputs {
  std::optional<RegionFileSource> region_file;
  std::shared_ptr<LiveRegion> attach;  // Null when nothing is attached.
  // The vCPUs did not run while the regions were copied (paused for a
  // panic, or QEMU gone): the copy is exact.
  bool vcpus_stopped = false;
  // QEMU's boot-handshake trace log (boot_trace.h), empty when the VM was
  // not booted with --trace-boot: copied (bounded) into the capture.
  std::filesystem::path qemu_trace_log;
  // |qemu_trace_log| is libvirt's log of the domain (libvirt_backend.h):
  // only the lines after its newest "starting up" line are this QEMU's.
  bool qemu_trace_log_is_libvirt = false;
  // Reads guest virtual memory (vm_backend.h GuestMemoryReader), set while
  // the vCPUs are stopped and QEMU is there to answer (a panic): the capture
  // reads the kernel's log with it (kernel_log_step.h). Null: not now.
  std::function<Result<std::vector<std::byte>>(uint64_t addr, size_t size)> read_guest_memory;
  // The guest's RAM read straight from QEMU (guest_ram.h), set with
  // |read_guest_memory| when the backend mapped it: the kernel log step
  // reads through it first, |read_guest_memory| where it cannot.
  std::shared_ptr<const GuestRam> guest_ram;
  // Writes a kdump-compressed dump of guest memory (QEMU's
  // dump-guest-memory) and returns the file it wrote (in the capture's
  // directory it is given, or wherever its hypervisor may write) for the
  // capture to take as its `vmcore` (vmcore = on-panic); null: no vmcore.
  using GuestMemoryDumper =
      std::function<Result<std::filesystem::path>(const std::filesystem::path& capture_dir)>;
  GuestMemoryDumper dump_guest_memory;
  // vmcore = on-panic, but the backend cannot dump: said in the manifest.
  bool dump_unavailable = false;
  // The dump's largest size (the guest's RAM), for the disk budget's
  // admission; 0: unknown.
  uint64_t vmcore_bound = 0;
  // manifest.extra.transport: {kind, …} what the backend knows of the VM.
  nlohmann::json transport = nlohmann::json::object();
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_INPUTS_H_
