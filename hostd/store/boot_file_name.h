// The names of a capture's per-boot files: "boot-<n>.trace.dat" (the boot's
// events, capture_pipeline.h), "boot-<n>.host-clock.dat" (the same on the
// host's clock, boot_timeline.h) and "boot-<n>.kernel.log" (its kernel log,
// crash_step.h). Writers and readers (the capture, `hvtrace
// show`) share them here, so a reader never accepts a name a writer would not
// make.
#ifndef HVTRACE_HOSTD_BOOT_FILE_NAME_H_
#define HVTRACE_HOSTD_BOOT_FILE_NAME_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace hvtrace::hostd {

inline constexpr std::string_view kBootTraceSuffix = ".trace.dat";
inline constexpr std::string_view kBootHostClockSuffix = ".host-clock.dat";
// The boot's kernel log, one line per record as dmesg prints it (crash_step.h).
inline constexpr std::string_view kBootKernelLogSuffix = ".kernel.log";

// "boot-<boot><suffix>".
std::string BootFileName(uint32_t boot, std::string_view suffix = kBootTraceSuffix);

// n of "boot-<n><suffix>" (1 to 6 decimal digits); nullopt for any other
// name, a directory entry a guest cannot choose but a person may have put
// there.
std::optional<uint32_t> BootOfFileName(std::string_view name,
                                       std::string_view suffix = kBootTraceSuffix);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_BOOT_FILE_NAME_H_
