// hvtrace show CAPTURE --timeline: a capture's host and guest sides of the
// boot as one text timeline on the host clock (hostd/timeline/boot_timeline.h
// wrote host.dat and boot-<n>.host-clock.dat):
//
//   # timeline of capture ID: host CLOCK_REALTIME ...
//   # boot 0: offset ... ns, drift ... ppm, error bound ... µs (method)
//   1795554630.485217 +10.225518 host  qemu-9798 [000] virtio_set_status: vdev=0x... val=1
//   1795554630.485202 +10.225503 guest modprobe-85 [001] hvt_virtio_status: (...) status=1
//
// Each line is the time on the host clock, the time since the first line,
// the side, and the event as `trace-cmd report` prints it (its own time
// stamp field taken out). Lines are merged by time stamp the way
// `trace-cmd report -i host.dat -i boot-0.host-clock.dat ...` merges the
// files: the smallest first, ties to the file named first (host.dat, then
// the boots oldest first).
#ifndef HVTRACE_HOSTD_CLI_SHOW_TIMELINE_H_
#define HVTRACE_HOSTD_CLI_SHOW_TIMELINE_H_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace hvtrace::cli {

// One file of a timeline: host.dat ("host"), boot-<n>.host-clock.dat
// ("guest", or "guest<n>" when there are several boots).
struct TimelineSource {
  std::filesystem::path path;
  std::string side;
  uint32_t boot = 0;  // The guest's boot number (0 for host.dat).
};
// |dir|'s timeline files: host.dat first, then the boots oldest first: the
// order trace-cmd is given them in, which decides ties.
std::vector<TimelineSource> TimelineSources(const std::filesystem::path& dir);

// |ns| as seconds with six decimals ("1795554630.485217"), as trace-cmd
// prints time stamps.
std::string SecondsText(uint64_t ns);

// trace-cmd's event line without its time stamp field: "comm-pid [cpu] TS:
// rest" -> "comm-pid [cpu] rest". TS is trace-cmd 3.1's seconds, or 3.3's
// latency column run into the nanoseconds ("d..1.1796406799009946109").
// A line with no such field is returned as it is (leading blanks dropped).
std::string TimelineEventText(std::string_view line);

// Prints |dir|'s timeline to |fd|. Exit status as `hvtrace show`.
int ShowTimeline(const std::filesystem::path& dir, const nlohmann::json& manifest, int fd);

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_SHOW_TIMELINE_H_
