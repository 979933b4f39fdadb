#include "capture_steps.h"

#include <chrono>
#include <future>
#include <system_error>

#include "boot_range_decode.h"
#include "boot_timeline.h"
#include "region_capture.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

// Puts |attach| where the layout says: region when it is the only one,
// region.attach beside a region file.
void PlaceAttachRegion(CaptureManifest& manifest, json attach) {
  if (manifest.region.is_object() && manifest.region.contains("kind") &&
      manifest.region["kind"] != "attach") {
    manifest.region["attach"] = std::move(attach);
  } else {
    manifest.region = std::move(attach);
  }
}

json& Timing(CaptureManifest& manifest) {
  if (!manifest.extra["timing_ms"].is_object()) manifest.extra["timing_ms"] = json::object();
  return manifest.extra["timing_ms"];
}

// |pending|'s recovery record, staged (written and fsynced, not yet in
// place) on a thread of its own while the copy runs; inline when no thread
// is to be had.
class StagedRecord {
 public:
  StagedRecord(PendingCapture& pending, const CaptureManifest& manifest) {
    try {
      staging_ = std::async(std::launch::async,
                            [&pending, manifest] { return pending.StageRecoveryRecord(manifest); });
    } catch (const std::system_error&) {
      inline_ = pending.StageRecoveryRecord(manifest);
    }
  }
  Status Wait() { return staging_.valid() ? staging_.get() : inline_; }

 private:
  std::future<Status> staging_;  // Its destructor waits for the thread.
  Status inline_;
};

}  // namespace

Status CopyRegionFileStep(const RegionFileSource& source, PageBuffer& copy, PendingCapture& pending,
                          CaptureManifest& manifest) {
  if (!source.file) return Error{"region " + source.path.string() + " is not open"};
  const double to_start = MsSince(manifest.triggered);
  // Reserved at registration (CaptureService::Reserve): no allocation here.
  if (!copy.Resize(source.size)) {
    return Error{"no memory for a copy of region " + source.path.string() + " (" +
                 std::to_string(source.size) + " bytes)"};
  }
  json region = {{"kind", source.boot_range ? "boot-range" : "shmem"},
                 {"source", source.path.string()},
                 {"offset", source.offset},
                 {"size", source.size},
                 {"gpa", source.gpa}};
  if (manifest.region.is_object() && manifest.region.value("kind", "") == "attach") {
    region["attach"] = std::move(manifest.region);
  }
  manifest.region = std::move(region);
  if (!source.kernel_path.empty()) manifest.kernel["path"] = source.kernel_path;
  if (!source.kernel_key.empty()) manifest.kernel["formats_key"] = source.kernel_key;
  json& timing = Timing(manifest);
  timing["trigger_to_copy_start"] = to_start;
  // The recovery record says what the copy is, not how long it took: staged
  // beside the copy, it leaves one flush after the copy (Build renames it
  // in) instead of two.
  StagedRecord record(pending, manifest);
  Result<PendingCapture::RegionCopyStats> stats = pending.CopyRegion(
      kRegionFileName, *source.file, source.path, source.offset, source.size, copy.span());
  const Status staged = record.Wait();
  if (!stats.ok()) return stats.error();
  if (!staged.ok()) return staged;
  timing["copy"] = stats->copy_ms;
  timing["region_write"] = stats->write_ms;
  timing["region_fsync"] = stats->sync_ms;
  timing["region_write_fsync"] = stats->write_ms + stats->sync_ms;
  timing["region_bytes_written"] = stats->bytes_written;
  timing["copy_minor_faults"] = stats->copy_minor_faults;
  timing["copy_cpu"] = stats->copy_cpu_ms;
  timing["copy_involuntary_switches"] = stats->involuntary_switches;
  timing["trigger_to_region_durable"] = MsSince(manifest.triggered);
  return {};
}

Status CopyAttachStep(const LiveRegion& region, std::vector<std::byte>& copy,
                      PendingCapture& pending, CaptureManifest& manifest) {
  const auto start = std::chrono::steady_clock::now();
  if (Status s = region.CopyInto(copy); !s.ok()) return s;
  const auto copied = std::chrono::steady_clock::now();
  if (Status s = pending.WriteFile(kAttachRegionFileName, copy); !s.ok()) {
    return Error{"attach region " + region.path().string() + ": " + s.error().message};
  }
  PlaceAttachRegion(manifest, {{"kind", "attach"},
                               {"source", region.path().string()},
                               {"size", region.size()},
                               {"region_id", region.geometry().region_id},
                               {"geometry", GeometryToJson(region.geometry())}});
  json& timing = Timing(manifest);
  timing["attach_copy"] = MsBetween(start, copied);
  timing["attach_write_fsync"] = MsBetween(copied, std::chrono::steady_clock::now());
  return {};
}

void DecodeRegionFileStep(std::span<const std::byte> copy, FormatsService* formats,
                          const std::filesystem::path& meta_dir, PendingCapture& pending,
                          CaptureManifest& manifest, const KernelLog* ring_log,
                          const KaslrHook& newest_kaslr) {
  if (manifest.region.value("kind", "") != "boot-range") return;  // A raw shmem file.
  const auto str = [&](const char* key) { return manifest.kernel.value(key, std::string()); };
  const auto start = std::chrono::steady_clock::now();
  const BootRangeDecodeTimes times = DecodeBootRange(copy,
                                                     {.cache = formats,
                                                      .kernel_key = str("formats_key"),
                                                      .kernel_path = str("path"),
                                                      .meta_dir = meta_dir,
                                                      .ring_log = ring_log,
                                                      .newest_kaslr = newest_kaslr},
                                                     pending.dir(), manifest);
  json& timing = Timing(manifest);
  timing["formats_load"] = times.formats_ms;
  timing["decode"] = times.decode_ms;
  timing["trace_dat_write"] = times.write_ms;
  timing["trace_dat_files"] = times.files_ms;
  timing["kernel_log"] = times.kernel_log_ms;
  timing["decode_prepare"] = times.prepare_ms;
  timing["decode_boot_kernels"] = times.boot_kernels_ms;
  timing["decode_step"] = MsBetween(start, std::chrono::steady_clock::now());
}

namespace {

json ConsistencyJson(bool vcpus_stopped, const json& validation, bool region_file) {
  json c = {
      {"vcpus_stopped", vcpus_stopped},
      {"note", vcpus_stopped
                   ? "vCPUs were stopped (or QEMU gone) while copying: the copy is exact"
                   : "the guest kept running while copying: each page was copied once; pages "
                     "being written then (listed per CPU for a boot range; torn slots counted "
                     "for an attach region) may be inconsistent"}};
  if (vcpus_stopped || !region_file) return c;
  json pages = json::array();
  if (validation.is_object() && validation.contains("per_cpu") &&
      validation["per_cpu"].is_array()) {
    for (const json& cpu : validation["per_cpu"]) {
      if (!cpu.is_object()) continue;
      pages.push_back({{"cpu", cpu.value("cpu", -1)},
                       {"head_slot", cpu.value("head_slot", json())},
                       {"commit_slot", cpu.value("commit_slot", json())}});
    }
  }
  c["pages_being_written"] = std::move(pages);
  return c;
}

}  // namespace

Status DecodeCopiesStep(std::span<const std::byte> region_copy, std::vector<std::byte>* attach_copy,
                        const RegionGeometry& geometry, bool vcpus_stopped, FormatsService* formats,
                        const std::filesystem::path& meta_dir, PendingCapture& pending,
                        CaptureManifest& manifest, const KernelLog* ring_log,
                        const KaslrHook& newest_kaslr) {
  if (!region_copy.empty()) {
    DecodeRegionFileStep(region_copy, formats, meta_dir, pending, manifest, ring_log, newest_kaslr);
    // QEMU's side of a --trace-boot VM's boot and the guest's, on the host clock.
    BootTimelineStep(pending, manifest);
  }
  if (attach_copy != nullptr) {
    Status s = DecodeAttachStep(*attach_copy, geometry, vcpus_stopped, pending, manifest);
    if (!s.ok()) return s;
  }
  manifest.extra["consistency"] =
      ConsistencyJson(vcpus_stopped, manifest.validation, !region_copy.empty());
  return {};
}

Status DecodeAttachStep(std::vector<std::byte>& copy, const RegionGeometry& geometry,
                        bool vcpus_stopped, PendingCapture& pending, CaptureManifest& manifest) {
  RegionCaptureOptions options;
  options.write_region = false;  // CopyAttachStep wrote it.
  options.vm_paused = vcpus_stopped;
  const auto start = std::chrono::steady_clock::now();
  Result<RegionCaptureResult> r = BuildRegionCapture(copy, geometry, options, pending, manifest);
  const json* attach = AttachRegionJson(manifest);
  const std::string source = attach ? attach->value("source", std::string()) : std::string();
  if (!r.ok()) return Error{"attach region " + source + ": " + r.error().message};
  Timing(manifest)["attach_decode_write"] = MsBetween(start, std::chrono::steady_clock::now());
  json files = r->files;
  if (manifest.region.value("kind", "") == "attach") {
    manifest.region["files"] = std::move(files);
  } else {
    manifest.region["attach"]["files"] = std::move(files);
  }
  return {};
}

const json* AttachRegionJson(const CaptureManifest& manifest) {
  if (!manifest.region.is_object()) return nullptr;
  if (manifest.region.value("kind", "") == "attach") return &manifest.region;
  auto it = manifest.region.find("attach");
  return it != manifest.region.end() && it->is_object() ? &*it : nullptr;
}

json GeometryToJson(const RegionGeometry& g) {
  return {{"region_size", g.region_size},
          {"region_id", g.region_id},
          {"slot_size", g.slot_size},
          {"max_cpus", g.max_cpus},
          {"slots_per_cpu", g.slots_per_cpu},
          {"format_entries", g.format_entries},
          {"format_text_size", g.format_text_size},
          {"dw_rings", g.dw_rings},
          {"dw_slots", g.dw_slots},
          {"format_offset", g.format_offset},
          {"cpu_offset", g.cpu_offset},
          {"cpu_stride", g.cpu_stride},
          {"dw_offset", g.dw_offset},
          {"dw_stride", g.dw_stride},
          {"symbol_offset", g.symbol_offset},
          {"symbol_size", g.symbol_size},
          {"comm_size", g.comm_size},
          {"comm_offset", g.comm_offset}};
}

Result<RegionGeometry> GeometryFromJson(const json& j) {
  if (!j.is_object()) return Error{"region geometry is not an object"};
  RegionGeometry g;
  bool ok = true;
  auto u64 = [&](const char* key, uint64_t& out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned())
      ok = false;
    else
      out = it->get<uint64_t>();
  };
  auto u32 = [&](const char* key, uint32_t& out) {
    uint64_t v = 0;
    u64(key, v);
    if (v > UINT32_MAX) ok = false;
    out = static_cast<uint32_t>(v);
  };
  u64("region_size", g.region_size);
  u64("region_id", g.region_id);
  u32("slot_size", g.slot_size);
  u32("max_cpus", g.max_cpus);
  u32("slots_per_cpu", g.slots_per_cpu);
  u32("format_entries", g.format_entries);
  u32("format_text_size", g.format_text_size);
  u32("dw_rings", g.dw_rings);
  u32("dw_slots", g.dw_slots);
  u64("format_offset", g.format_offset);
  u64("cpu_offset", g.cpu_offset);
  u64("cpu_stride", g.cpu_stride);
  u64("dw_offset", g.dw_offset);
  u64("dw_stride", g.dw_stride);
  u64("symbol_offset", g.symbol_offset);
  u32("symbol_size", g.symbol_size);
  u32("comm_size", g.comm_size);
  u64("comm_offset", g.comm_offset);
  if (!ok) return Error{"region geometry lacks a field or has one out of range"};
  if (Status s = ValidateGeometry(g); !s.ok())
    return Error{"region geometry: " + s.error().message};
  return g;
}

}  // namespace hvtrace::hostd
