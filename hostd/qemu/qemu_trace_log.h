// QEMU's own trace events for a VM's boot handshakes, as QEMU 7.2's `log`
// trace backend writes them with `-msg timestamp=on -D FILE`:
//
//   TID@SEC.USEC:event_name args...
//   12345@1732480000.123456:virtio_set_status vdev 0x55d0c0a8e1f0 val 3
//
// SEC.USEC is the host's CLOCK_REALTIME at microsecond resolution. The file
// is written by QEMU, which runs guest-controlled device emulation, so it is
// read as hostile input: bounded line length and count, malformed lines
// counted and skipped, never trusted for anything but display and clock
// pairing.
#ifndef HVTRACE_HOSTD_QEMU_TRACE_LOG_H_
#define HVTRACE_HOSTD_QEMU_TRACE_LOG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hvtrace::hostd {

// One parsed line.
struct QemuTraceEvent {
  uint64_t realtime_ns = 0;  // Host CLOCK_REALTIME (µs resolution, in ns).
  uint32_t tid = 0;          // QEMU thread that hit the event.
  std::string name;          // e.g. "virtio_set_status".
  // "key value" pairs in the order QEMU printed them, e.g. {"vdev",
  // "0x55d0c0a8e1f0"}, {"val", "3"}. Text that is not key/value pairs is
  // one pair with an empty key.
  std::vector<std::pair<std::string, std::string>> args;
};

struct QemuTraceLog {
  std::vector<QemuTraceEvent> events;  // In file order.
  uint64_t malformed_lines = 0;        // Skipped; not events.
  uint64_t dropped_lines = 0;          // Beyond the limits below.
  std::string first_problem;           // "line N: why", empty when none.
};

inline constexpr size_t kQemuTraceMaxLine = 4096;
inline constexpr size_t kQemuTraceMaxEvents = 1'000'000;

// Parses a whole log file's text. Never fails: what cannot be read is
// counted in the result.
QemuTraceLog ParseQemuTraceLog(std::string_view text);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_QEMU_TRACE_LOG_H_
