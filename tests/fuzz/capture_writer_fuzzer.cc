// Fuzzes a boot-range capture from region bytes to trace.dat files with the
// real 6.12 fixture formats (kallsyms included): ReadBootMap, the KASLR
// relocation from the guest's meta page, the kallsyms subset, saved
// cmdlines and the trace.dat writer. Seeds: tests/fixtures/fuzz/boot_map/.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "boot_range_decode.h"
#include "capture_pipeline.h"

namespace {

namespace fs = std::filesystem;

struct Setup {
  std::shared_ptr<const hvtrace::hostd::KernelFormats> formats;
  fs::path out;
};

const Setup& Get() {
  static const Setup setup = [] {
    Setup s;
    auto formats = hvtrace::hostd::KernelFormatsFromDirectory(std::string(HVTRACE_FIXTURES_DIR) +
                                                              "/boot_map/");
    if (!formats.ok()) __builtin_trap();  // The fixture is part of the tree.
    s.formats = std::make_shared<const hvtrace::hostd::KernelFormats>(std::move(*formats));
    s.out = fs::temp_directory_path() / ("hvtrace-capture-fuzz-" + std::to_string(getpid()));
    fs::create_directories(s.out);
    return s;
  }();
  return setup;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const Setup& setup = Get();
  const std::span<const std::byte> range(reinterpret_cast<const std::byte*>(data), size);
  // The one decode every reader uses (boot_range_decode.h).
  for (int cpus : {0, 2}) {
    hvtrace::hostd::CaptureManifest manifest;
    hvtrace::hostd::DecodeBootRange(range, {.formats = setup.formats, .cpus = cpus}, setup.out,
                                    manifest);
  }
  return 0;
}
