// Where a capture's objects go in the bucket (docs/fleet.md):
//
//   <prefix>/<host>/<vm>/<capture-id>/manifest.json
//                                     boot-0.trace.dat, …   as stored locally
//                                     region.bin.zst, …     *.bin, zstd-compressed
//                                     index.json            the capture's index
//   <prefix>/index/<host>/<vm>/<capture-id>.json            the same index, written last
//
// The index under <prefix>/index/ is the last object of a capture: present
// means complete. `hvtrace fleet list` lists only that prefix, and the key
// alone says host, VM, time and trigger (capture ids are
// <UTC time>-<trigger>[-N]), so filtering needs no GET.
#ifndef HVTRACE_HOSTD_FLEET_FLEET_KEYS_H_
#define HVTRACE_HOSTD_FLEET_FLEET_KEYS_H_

#include <optional>
#include <string>
#include <string_view>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

// A capture's place in the fleet.
struct FleetCaptureRef {
  std::string host;
  std::string vm;
  std::string id;
  // "host/vm/id": what `hvtrace fleet fetch` takes.
  std::string Name() const { return host + "/" + vm + "/" + id; }
};

// |prefix| without leading/trailing '/', checked as an object key part ("" ok).
Result<std::string> NormalizePrefix(std::string_view prefix);

// This host's name as a key component: gethostname(), characters other than
// [A-Za-z0-9._-] replaced by '_'.
std::string FleetHostName();

// "<prefix>/<host>/<vm>/<id>/" (no leading '/' when |prefix| is empty).
std::string CaptureKeyPrefix(std::string_view prefix, const FleetCaptureRef& ref);
// "<prefix>/index/" and "<prefix>/index/<host>/<vm>/<id>.json".
std::string IndexListPrefix(std::string_view prefix);
std::string IndexListKey(std::string_view prefix, const FleetCaptureRef& ref);

// The object name of a capture's local file: *.bin gets ".zst" (compressed).
std::string ObjectNameOf(std::string_view file);
bool CompressedInStore(std::string_view file);

// Parses a key under IndexListPrefix(prefix); nullopt for anything else.
std::optional<FleetCaptureRef> ParseIndexListKey(std::string_view prefix, std::string_view key);

// A capture id's UTC time ("20250612T101530.123Z") and trigger ("panic").
struct CaptureIdParts {
  std::string utc;
  std::string trigger;
};
std::optional<CaptureIdParts> ParseCaptureId(std::string_view id);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FLEET_FLEET_KEYS_H_
