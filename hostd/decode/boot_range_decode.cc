#include "boot_range_decode.h"

#include <chrono>
#include <map>
#include <memory>
#include <optional>

#include "boot_kernels.h"
#include "capture_pipeline.h"
#include "event_id_table.h"
#include "meta_store.h"

namespace hvtrace::hostd {

using nlohmann::json;

namespace {

// How much earlier than the estimated start of the captured boot its channel
// boot may have arrived and still be taken as that boot's (guest clock vs
// host clock).
constexpr int64_t kBootStartSlackNs = 2'000'000'000;

// The VM's channel boots, loaded on demand for one decode: range boot i of
// B ↔ channel boot M - B + i of M (arrival order, the newest is the boot
// that panicked) — unless the newest arrived before the captured boot
// began (its start estimated from the trigger time less the last boot's
// newest event time): then the captured boot never sent its own (it died
// before its agent ran) and the pairing moves down by one.
class ChannelBoots {
 public:
  ChannelBoots(const std::filesystem::path& dir, int64_t triggered_ns, json& info)
      : store_(dir), triggered_ns_(triggered_ns), info_(info) {
    if (dir.empty()) return;
    Result<std::vector<MetaBootEntry>> list = store_.List();
    if (!list.ok()) {
      info_["error"] = list.error().message;
      return;
    }
    entries_ = std::move(*list);
    info_["dir"] = dir.string();
    info_["boots"] = entries_.size();
  }
  bool empty() const { return entries_.empty(); }

  // The newest loadable boot's formats (for the page layout), or null.
  const KernelFormats* Newest() {
    for (size_t i = entries_.size(); i-- > 0;) {
      if (const KernelFormats* f = Load(i)) return f;
    }
    return nullptr;
  }

  // |cached| (may be null): the kernel file's formats, for boots the channel
  // did not describe.
  BootFormats For(uint32_t boot, std::span<const uint64_t> last, const KernelFormats* cached) {
    if (!shift_) shift_ = Shift(last);
    const int64_t index =
        static_cast<int64_t>(entries_.size()) - static_cast<int64_t>(last.size()) + boot + *shift_;
    if (index >= 0 && index < static_cast<int64_t>(entries_.size())) {
      if (const KernelFormats* f = Load(static_cast<size_t>(index))) {
        const MetaBootEntry& e = entries_[static_cast<size_t>(index)];
        Result<std::string> comms = store_.LoadComms(e);
        json source = {{"from", "meta channel"},
                       {"boot_id", e.boot_id},
                       {"build_id", e.build_id},
                       {"release", e.release},
                       {"verified", e.verified},
                       {"symbols", "this boot's own"},
                       {"comms", comms.ok() && !comms->empty()}};
        // A boot whose agent sent newer bundles (events came later): the newest decodes it.
        if (e.revision > 1) source["bundle"] = {{"revision", e.revision}, {"changes", e.changes}};
        return {f, comms.ok() ? *comms : std::string(), true, std::move(source)};
      }
    }
    if (cached != nullptr) {
      return {cached, {}, false, {{"from", "kernel file harvest"}, {"key", cached->key}}};
    }
    // No metadata for this (older) boot: the nearest boot's, its symbols
    // unverified (that boot may have run another kernel or KASLR offset).
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (const KernelFormats* f = Load(i)) {
        return {f,
                {},
                true,
                {{"from", "meta channel (nearest boot)"},
                 {"boot_id", entries_[i].boot_id},
                 {"symbols", "unverified: the channel sent nothing for this boot"}}};
      }
    }
    return {};
  }

 private:
  int64_t Shift(std::span<const uint64_t> last) {
    if (entries_.empty() || last.empty() || last.back() == 0 || triggered_ns_ <= 0) return 0;
    const int64_t received = entries_.back().received_ns;
    const int64_t start = triggered_ns_ - static_cast<int64_t>(last.back());
    if (received == 0 || received >= start - kBootStartSlackNs) return 0;
    info_["pairing"] = "the newest channel boot (" + entries_.back().boot_id + ", received " +
                       entries_.back().received_utc + ") arrived " +
                       std::to_string((start - received) / 1'000'000) +
                       " ms before the captured boot began: it is taken as the boot before, "
                       "and the captured boot has no channel metadata";
    return 1;
  }

  const KernelFormats* Load(size_t i) {
    auto it = loaded_.find(i);
    if (it == loaded_.end()) {
      Result<KernelFormats> f = store_.LoadFormats(entries_[i]);
      if (!f.ok()) {
        info_["load_errors"][entries_[i].boot_id] = f.error().message;
        it = loaded_.emplace(i, nullptr).first;
      } else {
        it = loaded_.emplace(i, std::make_unique<KernelFormats>(std::move(*f))).first;
      }
    }
    return it->second.get();
  }

  MetaStore store_;
  const int64_t triggered_ns_;
  json& info_;
  std::optional<int64_t> shift_;
  std::vector<MetaBootEntry> entries_;
  std::map<size_t, std::unique_ptr<KernelFormats>> loaded_;
};

}  // namespace

BootRangeDecodeTimes DecodeBootRange(std::span<const std::byte> copy,
                                     const BootRangeSources& sources,
                                     const std::filesystem::path& dir, CaptureManifest& manifest) {
  BootRangeDecodeTimes times;
  const auto start = std::chrono::steady_clock::now();
  FormatsService* const formats_service = sources.cache;
  const std::string& kernel_key = sources.kernel_key;
  const std::filesystem::path& meta_dir = sources.meta_dir;
  std::shared_ptr<const KernelFormats> formats;
  std::string state = "missing";
  json meta_info = json::object();
  ChannelBoots channel(meta_dir, manifest.triggered.realtime_ns, meta_info);
  if (sources.formats) {
    formats = sources.formats;
    state = "given";
  } else if (kernel_key.empty()) {
    state = "unknown kernel (adopted VM)";
  } else if (formats_service != nullptr) {
    Result<std::shared_ptr<const KernelFormats>> got = formats_service->Get(kernel_key);
    if (!got.ok()) {
      state = "unreadable: " + got.error().message;
    } else if (*got) {
      formats = *got;
      state = "cached";
    } else {
      state = formats_service->StateOf(kernel_key);
    }
  }
  times.formats_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  json info = {
      {"key", formats ? formats->key : kernel_key},
      {"cache", formats_service != nullptr ? formats_service->root().string() : std::string()},
      {"state", state}};
  BootMapCaptureOptions options;
  options.cpus = sources.cpus;
  options.progress = sources.progress;
  options.ring_log = sources.ring_log;
  options.newest_kaslr = sources.newest_kaslr;
  std::string decode_error;
  // Each boot's kernel identified by its console banner and checked against
  // the data (boot_kernels.h); the per-boot choices feed the id table.
  const auto kernels_start = std::chrono::steady_clock::now();
  BootKernels kernels(copy, formats.get(), formats_service,
                      ReadConsoleBanners(ConsoleLogOfMetaDir(meta_dir)), options);
  kernels.LendMap(options);
  const auto prepared = std::chrono::steady_clock::now();
  times.boot_kernels_ms =
      std::chrono::duration<double, std::milli>(prepared - kernels_start).count();
  times.prepare_ms = std::chrono::duration<double, std::milli>(prepared - start).count();
  const KernelFormats* identified = formats ? nullptr : kernels.NewestIdentified();
  // A decode that worked: its figures go to the manifest; false if it failed.
  auto decoded = [&](const Result<CaptureResult>& built) {
    if (!built.ok()) {
      decode_error = built.error().message;
      return false;
    }
    kernels.AnnotateBoots(manifest.extra["boots"]);
    info["identify"] = kernels.Summary();
    info["events_across_boots"] = EventsAcrossBoots(kernels.chosen());
    info["decoded"] = true;
    info["unknown_id_events"] = built->unknown_id;
    times.decode_ms = built->decode_ms;
    times.write_ms = built->write_ms;
    times.files_ms = built->files_ms;
    times.kernel_log_ms = built->kernel_log_ms;
    manifest.extra["formats"] = std::move(info);
    return true;
  };
  // The metadata channel's boots, each decoding its own boot of the range.
  const KernelFormats* newest = formats ? formats.get() : channel.Newest();
  if (const KernelFormats* layout = newest ? newest : identified;
      !channel.empty() && layout != nullptr) {
    const KernelFormats* cached = formats ? formats.get() : identified;
    kernels.set_default(layout);
    Result<CaptureResult> built = BuildBootMapCapture(
        copy, *layout,
        [&](uint32_t boot, std::span<const uint64_t> last) {
          return kernels.For(boot, last.size(), channel.For(boot, last, cached));
        },
        options, dir, manifest);
    info["meta"] = std::move(meta_info);
    if (built.ok()) info["state"] = state + "; metadata channel";
    if (decoded(built)) return times;
  } else if (const KernelFormats* f = formats ? formats.get() : identified) {
    kernels.set_default(f);
    const BootFormatsFor same = SameFormats(*f);
    const BootFormatsFor per_boot = [&](uint32_t boot, std::span<const uint64_t> last) {
      return kernels.For(boot, last.size(), same(boot, last));
    };
    if (decoded(BuildBootMapCapture(copy, *f, per_boot, options, dir, manifest))) return times;
  }
  // No formats (or the decode failed): count what the region holds so the
  // manifest still says it; `hvtrace show` decodes region.bin later.
  info["decoded"] = false;
  if (!meta_info.empty() && !info.contains("meta")) info["meta"] = std::move(meta_info);
  if (!decode_error.empty()) info["decode_error"] = decode_error;
  const std::string kernel = sources.kernel_path.empty() ? "K" : sources.kernel_path;
  info["identify"] = kernels.Summary();
  // The CLI's harvest goes to the daemon answering on its socket, which
  // harvests into this cache (FormatsHarvestRequest, control/requests.h).
  info["note"] = "formats: " + state + ", run hvtrace formats harvest --kernel " + kernel +
                 " (hvtraced harvests it into its cache); `hvtrace show CAPTURE` then decodes "
                 "region.bin";
  Result<CaptureResult> counted = CountBootMapCapture(copy, options, manifest);
  if (counted.ok()) {
    times.decode_ms = counted->decode_ms;
  } else {
    manifest.validation = {{"reader", "boot_map"}, {"error", counted.error().message}};
  }
  manifest.extra["formats"] = std::move(info);
  return times;
}

}  // namespace hvtrace::hostd
