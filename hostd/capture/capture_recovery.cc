#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "capped_file.h"
#include "capture_service.h"
#include "capture_steps.h"
#include "host_time.h"

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
  json record =
      json::parse(reinterpret_cast<const char*>(bytes->data()),
                  reinterpret_cast<const char*>(bytes->data()) + bytes->size(), nullptr, false);
  // Types checked before values are read: json::value() throws on a value
  // of another type ("format": [] aborted the daemon's start, fuzzer).
  const auto format = record.is_object() ? record.find("format") : record.end();
  if (record.is_discarded() || !record.is_object() || format == record.end() ||
      !format->is_string() || *format != "hvtrace-capture-recovery" ||
      !record.contains("manifest")) {
    return Error{path.string() + " is not an hvtrace recovery record"};
  }
  Result<CaptureManifest> manifest = CaptureManifest::FromJson(record["manifest"]);
  if (!manifest.ok()) return Error{path.string() + ": " + manifest.error().message};
  return manifest;
}

// A copy file of the capture, exactly |size| bytes.
Result<std::vector<std::byte>> ReadCopy(const fs::path& path, uint64_t size) {
  Result<std::vector<std::byte>> copy = ReadCappedFileBytes(path, size);
  if (!copy.ok()) return copy.error();
  if (copy->size() != size) {
    return Error{path.string() + " is " + std::to_string(copy->size()) + " bytes, the region " +
                 std::to_string(size)};
  }
  return copy;
}

Result<uint64_t> RegionSize(const json& region, const char* what) {
  if (!region.is_object() || !region.contains("size") || !region["size"].is_number_unsigned() ||
      region["size"].get<uint64_t>() == 0 || region["size"].get<uint64_t>() > kMaxRegionBytes) {
    return Error{std::string("its recovery record names no ") + what + " of a usable size"};
  }
  return region["size"].get<uint64_t>();
}

// Finishes one capture (steps 3–4 of capture_service.h); on error the
// caller drops it.
Result<CaptureEntry> Finish(PendingCapture& pending, FormatsService* formats,
                            const std::filesystem::path& meta_dir) {
  Result<CaptureManifest> manifest = ReadRecord(pending.dir());
  if (!manifest.ok()) return manifest.error();
  CaptureManifest& m = *manifest;
  const std::string kind =
      m.region.is_object() ? m.region.value("kind", std::string()) : std::string();
  std::vector<std::byte> region_copy;
  if (kind == "boot-range" || kind == "shmem") {
    Result<uint64_t> size = RegionSize(m.region, "region file");
    if (!size.ok()) return size.error();
    Result<std::vector<std::byte>> copy = ReadCopy(pending.dir() / kRegionFileName, *size);
    if (!copy.ok()) return copy.error();
    region_copy = std::move(*copy);
  }
  std::vector<std::byte> attach_copy;
  RegionGeometry geometry;
  const json* attach = AttachRegionJson(m);
  if (attach != nullptr) {
    Result<RegionGeometry> g = GeometryFromJson(attach->value("geometry", json()));
    if (!g.ok()) return g.error();
    geometry = *g;
    Result<std::vector<std::byte>> copy =
        ReadCopy(pending.dir() / kAttachRegionFileName, geometry.region_size);
    if (!copy.ok()) return copy.error();
    attach_copy = std::move(*copy);
  } else if (region_copy.empty()) {
    return Error{"its recovery record names no region this daemon can finish"};
  }
  const bool stopped = m.extra.value("/consistency/vcpus_stopped"_json_pointer, false);
  // The copies are durable and checked: a decode failure is noted, not fatal.
  if (Status s = DecodeCopiesStep(region_copy, attach ? &attach_copy : nullptr, geometry, stopped,
                                  formats, meta_dir, pending, m);
      !s.ok()) {
    m.extra["incomplete"] = s.error().message;
  }
  // From the trigger, across the daemon's stop: the capture's real latency.
  m.extra["timing_ms"]["trigger_to_decoded"] = MsSince(m.triggered);
  const HostTime now = HostTime::Now();
  m.recovered = {{"at",
                  {{"realtime_ns", now.realtime_ns},
                   {"monotonic_ns", now.monotonic_ns},
                   {"utc", UtcStamp(now.realtime_ns)}}},
                 {"note",
                  "hvtraced stopped after region.bin (or attach-region.bin) was durable and before "
                  "the capture was "
                  "committed; a later run decoded the copy and committed it (timings from "
                  "the decode on are that run's; the copy's are not kept)"}};
  return pending.Commit(std::move(m));
}

}  // namespace

Result<CaptureService::RecoveryReport> CaptureService::Recover(const CaptureStore& store) {
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
      report.removed.push_back(dir.string() +
                               ": removed, no recovery record (the daemon stopped before "
                               "the region copy was durable)");
      continue;  // |pending| removes it.
    }
    Result<CaptureEntry> entry = Error{"not finished"};
    try {
      entry = Finish(**pending, formats_.get(), MetaDirOfStore(store));
    } catch (const nlohmann::json::exception& e) {
      // A field of the record whose type no check above caught: the record
      // is malformed, like one that does not parse, not a reason to stop.
      entry = Error{"its recovery record is malformed: " + std::string(e.what())};
    }
    if (!entry.ok() && (*pending)->kept()) {
      // Durable and readable, but not committable now (a full disk).
      report.kept.push_back(dir.string() + ": " + entry.error().message);
      continue;
    }
    if (!entry.ok()) {
      (*pending)->Abandon();
      report.removed.push_back(dir.string() +
                               ": removed, cannot be finished: " + entry.error().message);
      continue;
    }
    report.recovered.push_back(std::move(*entry));
  }
  return report;
}

}  // namespace hvtrace::hostd
