// Decoding a boot-range capture's private region copy with the kernel's
// formats from the daemon's cache: boot-<n>.trace.dat files into the capture
// and the manifest's counts, validation and extra.formats. Shared by the live
// capture (qmp_vm.cc) and by a later daemon run finishing a capture the
// previous one died in (capture_recovery.cc).
#ifndef HVTRACE_HOSTD_BOOT_RANGE_DECODE_H_
#define HVTRACE_HOSTD_BOOT_RANGE_DECODE_H_

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>

#include "capture_store.h"
#include "formats_service.h"

namespace hvtrace::hostd {

struct BootRangeDecodeTimes {
  double formats_ms = 0, decode_ms = 0, write_ms = 0;
  double files_ms = 0;  // Of write_ms: writing the trace.dat files themselves.
};

// Decodes |copy| into |capture|: each boot with the metadata its guest sent
// for it over the metadata channel (the VM's MetaStore at |meta_dir|, empty:
// none), the others with the formats of |kernel_key| (null |formats| or an
// unknown key and no channel metadata: counts only, and extra.formats says
// how to get them; |kernel_path| names the kernel in that note). Never fails:
// a decode error is recorded in extra.formats.decode_error and the counts
// kept. extra.formats.meta and extra.boots[n].decoded_with say which boot's
// metadata decoded what.
BootRangeDecodeTimes DecodeBootRangeCopy(std::span<const std::byte> copy, FormatsService* formats,
                                         const std::string& kernel_key,
                                         const std::string& kernel_path,
                                         const std::filesystem::path& meta_dir,
                                         PendingCapture& capture, CaptureManifest& manifest);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_BOOT_RANGE_DECODE_H_
