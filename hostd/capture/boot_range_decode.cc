#include "boot_range_decode.h"

#include <chrono>
#include <memory>

#include "capture_pipeline.h"

namespace hvtrace::hostd {

using nlohmann::json;

BootRangeDecodeTimes DecodeBootRangeCopy(std::span<const std::byte> copy,
                                         FormatsService* formats_service,
                                         const std::string& kernel_key,
                                         const std::string& kernel_path, PendingCapture& capture,
                                         CaptureManifest& manifest) {
  BootRangeDecodeTimes times;
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<const KernelFormats> formats;
  std::string state = "missing";
  if (kernel_key.empty()) {
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
      {"key", kernel_key},
      {"cache", formats_service != nullptr ? formats_service->root().string() : std::string()},
      {"state", state}};
  BootMapCaptureOptions options;
  options.write_region = false;  // The caller wrote (and fsynced) region.bin.
  std::string decode_error;
  if (formats) {
    Result<CaptureResult> built = BuildBootMapCapture(copy, *formats, options, capture, manifest);
    if (built.ok()) {
      info["decoded"] = true;
      info["unknown_id_events"] = built->unknown_id;
      times.decode_ms = built->decode_ms;
      times.write_ms = built->write_ms;
      manifest.extra["formats"] = std::move(info);
      return times;
    }
    decode_error = built.error().message;
  }
  // No formats (or the decode failed): count what the region holds so the
  // manifest still says it; `hvtrace show` decodes region.bin later.
  info["decoded"] = false;
  if (!decode_error.empty()) info["decode_error"] = decode_error;
  const std::string kernel = kernel_path.empty() ? "K" : kernel_path;
  info["note"] = "formats: " + state + ", run hvtrace formats harvest --kernel " + kernel +
                 " --initrd I; `hvtrace show CAPTURE` then decodes region.bin";
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
