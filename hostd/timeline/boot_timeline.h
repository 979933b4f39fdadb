// One timeline of a VM's boot: QEMU's side (its trace log) and the guest's
// side (the boot range's boot-<n>.trace.dat files) on the host's
// CLOCK_REALTIME, written beside them in the capture:
//
//   host.dat                  QEMU's events (host_trace_dat.h), host clock
//   boot-<n>.host-clock.dat   boot n's events re-stamped onto the host
//                             clock (clock_fit.h), same formats and symbols
//
// so that `trace-cmd report -i host.dat -i boot-<n>.host-clock.dat` (and
// KernelShark) merge them, and `hvtrace show CAPTURE --timeline` prints one
// merged text timeline. A boot whose clock cannot be placed (no handshake
// pairs) gets no host-clock file, and the manifest says why. The guest's
// half of each handshake is the boot instance's kprobe event
// kprobes:hvt_virtio_status (field "status": the value written; "index":
// the virtio device's index, when recorded), and the writes of built-in
// drivers made before userspace, which the guest copies into the instance
// as "hvtrace-early: hvt_virtio_status ts=S.USEC ... status=N index=I"
// markers (ftrace:print; the time stamp is the text's, µs).
//
// The agent's clock-sync samples (region.h ClockSync, the metadata channel's
// kClock) are not used: they relate guest clocks to each other (TSC,
// CLOCK_MONOTONIC, CLOCK_BOOTTIME, and the guest's own CLOCK_REALTIME, which
// under QEMU starts from the emulated RTC at 1 s resolution), none of them
// to the host's clock. The manifest says so.
#ifndef HVTRACE_HOSTD_CAPTURE_BOOT_TIMELINE_H_
#define HVTRACE_HOSTD_CAPTURE_BOOT_TIMELINE_H_

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "capture_store.h"

namespace hvtrace::hostd {

inline constexpr const char* kHostTraceDatName = "host.dat";
inline constexpr const char* kGuestStatusSystem = "kprobes";
inline constexpr const char* kGuestStatusEvent = "hvt_virtio_status";
inline constexpr size_t kMaxQemuTraceLogBytes = size_t{256} << 20;

// "boot-<n>.host-clock.dat".
std::string HostClockFileName(uint32_t boot);

struct BootTimelineOutput {
  nlohmann::json timeline;         // manifest extra.timeline
  std::vector<std::string> files;  // Written into the directory.
};

// Builds the outputs above in |dir| from the boot files there and
// |qemu_log| (the text of QEMU's trace log). Never fails: what could not be
// done is in the returned timeline ("error" per part). The files are not
// fsynced (TraceDatSync::kCallerSyncs): PendingCapture::Commit syncs them.
BootTimelineOutput BuildBootTimeline(const std::filesystem::path& dir, std::string_view qemu_log);

// The capture step: when |pending| holds qemu-trace.log, builds the
// timeline there and records it as manifest extra.timeline; nothing
// otherwise. Call after the boot range was decoded.
void BootTimelineStep(PendingCapture& pending, CaptureManifest& manifest);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_BOOT_TIMELINE_H_
