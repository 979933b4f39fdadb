// The per-capture index object (docs/fleet.md): what a fleet needs to find a
// capture without downloading it. Built from the capture's own manifest.json
// and the tail of its decoded trace.dat files:
//
//   {"format": "hvtrace-fleet-index", "version": 1, "host", "vm", "id",
//    "trigger", "time": {"triggered_utc", "triggered_ns", "completed_utc"},
//    "kernel": {"release"}, "totals": {events, pages, lost_events, bad_pages},
//    "cpus", "files": [{"name", "bytes", "object", "compressed"}],
//    "incomplete" (when the capture is), "last_events": {"boot-0.trace.dat":
//    ["<the last lines `hvtrace report` prints>", …]}}
#ifndef HVTRACE_HOSTD_FLEET_CAPTURE_INDEX_H_
#define HVTRACE_HOSTD_FLEET_CAPTURE_INDEX_H_

#include <cstddef>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "fleet_keys.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

inline constexpr size_t kIndexLastEvents = 20;
// The largest manifest.json read (a capture's manifest is a few KiB).
inline constexpr uint64_t kMaxManifestBytes = 16u << 20;

// Reads |dir|/manifest.json; errors name the file.
Result<nlohmann::json> ReadManifest(const std::filesystem::path& dir);

// The index of the capture in |dir| (see above).
Result<nlohmann::json> BuildCaptureIndex(const std::filesystem::path& dir,
                                         const FleetCaptureRef& ref);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FLEET_CAPTURE_INDEX_H_
