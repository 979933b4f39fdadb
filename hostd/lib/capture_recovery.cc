#include "capture_recovery.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "boot_range_decode.h"
#include "capped_file.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr size_t kMaxRecordBytes = 16u << 20;
// A boot range is sized by hostd (MiBs); anything past this is not ours.
constexpr uint64_t kMaxRegionBytes = 64ull << 30;

// The manifest a capture had when its region copy became durable.
Result<CaptureManifest> ReadRecord(const fs::path& dir) {
  const fs::path path = dir / std::string(kRecoveryRecordName);
  Result<std::vector<std::byte>> bytes = ReadCappedFileBytes(path, kMaxRecordBytes);
  if (!bytes.ok()) return bytes.error();
  json record = json::parse(reinterpret_cast<const char*>(bytes->data()),
                            reinterpret_cast<const char*>(bytes->data()) + bytes->size(), nullptr, false);
  if (record.is_discarded() || !record.is_object() || record.value("format", "") != "hvtrace-capture-recovery" ||
      !record.contains("manifest")) {
    return Error{path.string() + " is not an hvtrace recovery record"};
  }
  Result<CaptureManifest> manifest = CaptureManifest::FromJson(record["manifest"]);
  if (!manifest.ok()) return Error{path.string() + ": " + manifest.error().message};
  return manifest;
}

std::string StringOr(const json& object, const char* key) {
  return object.is_object() && object.contains(key) && object[key].is_string() ? object[key].get<std::string>()
                                                                                : std::string();
}

// Finishes one capture; on error the caller drops it.
Result<CaptureEntry> Finish(PendingCapture& pending, FormatsService* formats) {
  Result<CaptureManifest> manifest = ReadRecord(pending.dir());
  if (!manifest.ok()) return manifest.error();
  CaptureManifest& m = *manifest;
  if (StringOr(m.region, "kind") != "boot-range" || !m.region.contains("size") ||
      !m.region["size"].is_number_unsigned() || m.region["size"].get<uint64_t>() == 0 ||
      m.region["size"].get<uint64_t>() > kMaxRegionBytes) {
    return Error{"its recovery record names no boot-range region of a usable size"};
  }
  const uint64_t size = m.region["size"].get<uint64_t>();
  const fs::path region_path = pending.dir() / "region.bin";
  Result<std::vector<std::byte>> copy = ReadCappedFileBytes(region_path, size);
  if (!copy.ok()) return copy.error();
  if (copy->size() != size) {
    return Error{region_path.string() + " is " + std::to_string(copy->size()) + " bytes, the region " +
                 std::to_string(size)};
  }
  const HostTime started = HostTime::Now();
  const BootRangeDecodeTimes times = DecodeBootRangeCopy(*copy, formats, StringOr(m.kernel, "formats_key"),
                                                         StringOr(m.kernel, "path"), pending, m);
  if (!m.extra.contains("timing_ms") || !m.extra["timing_ms"].is_object()) m.extra["timing_ms"] = json::object();
  m.extra["timing_ms"]["formats_load"] = times.formats_ms;
  m.extra["timing_ms"]["decode"] = times.decode_ms;
  m.extra["timing_ms"]["trace_dat_write"] = times.write_ms;
  m.recovered = {{"at", {{"realtime_ns", started.realtime_ns},
                         {"monotonic_ns", started.monotonic_ns},
                         {"utc", UtcStamp(started.realtime_ns)}}},
                 {"note", "hvtraced stopped after region.bin was durable and before the capture was "
                          "committed; a later run decoded region.bin and committed it (timings after "
                          "trigger_to_region_durable are that run's)"}};
  return pending.Commit(std::move(m));
}

}  // namespace

Result<RecoveryReport> RecoverIncompleteCaptures(const CaptureStore& store, FormatsService* formats) {
  Result<std::vector<fs::path>> incomplete = store.ListIncomplete();
  if (!incomplete.ok()) return incomplete.error();
  RecoveryReport report;
  for (const fs::path& dir : *incomplete) {
    Result<std::unique_ptr<PendingCapture>> pending = store.Resume(dir);
    if (!pending.ok()) {
      // Not a name this store gives: nothing in it can be finished.
      std::error_code ec;
      fs::remove_all(dir, ec);
      report.removed.push_back(dir.string() + ": removed, " + pending.error().message +
                               (ec ? " (removing failed: " + ec.message() + ")" : std::string()));
      continue;
    }
    std::error_code ec;
    if (!fs::exists(dir / std::string(kRecoveryRecordName), ec)) {
      report.removed.push_back(dir.string() + ": removed, no recovery record (the daemon stopped before "
                                              "region.bin was durable)");
      continue;  // |pending| removes it.
    }
    Result<CaptureEntry> entry = Finish(**pending, formats);
    if (!entry.ok()) {
      report.removed.push_back(dir.string() + ": removed, cannot be finished: " + entry.error().message);
      continue;
    }
    report.recovered.push_back(std::move(*entry));
  }
  return report;
}

}  // namespace hvtrace::hostd
