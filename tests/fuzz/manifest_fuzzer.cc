// Fuzzes what hvtraced reads back from its own state directory, which a
// crash can leave half-written: capture manifests (CaptureManifest::FromJson)
// and recovery records, through the real recovery (CaptureService::Recover on
// a store holding the input as an incomplete capture's recovery.json).
// Scratch files go under $TMPDIR (tests/run.sh gives each fuzzer its own
// and removes it: libFuzzer ends with _Exit, no destructor runs). Seeds:
// tests/fixtures/fuzz/manifest/.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "capture_service.h"
#include "capture_store.h"

namespace {

namespace fs = std::filesystem;

const fs::path& Root() {
  static const fs::path root = [] {
    fs::path p = fs::temp_directory_path() / ("hvtrace-manifest-fuzz-" + std::to_string(getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
  }();
  return root;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const char* text = reinterpret_cast<const char*>(data);
  nlohmann::json doc = nlohmann::json::parse(text, text + size, nullptr, false);
  if (!doc.is_discarded()) (void)hvtrace::hostd::CaptureManifest::FromJson(doc);

  // The same bytes as a dead run's recovery record, next to an empty copy.
  const fs::path captures = Root() / "captures";
  fs::remove_all(captures);
  const fs::path pending = captures / ".tmp-20261124T000000Z-panic-fuzz00";
  fs::create_directories(pending);
  std::ofstream(pending / "recovery.json", std::ios::binary).write(text, static_cast<long>(size));
  std::ofstream(pending / "region.bin", std::ios::binary).write(text, static_cast<long>(size / 2));
  hvtrace::hostd::CaptureStore store(captures);
  (void)hvtrace::hostd::CaptureService(nullptr, 1).Recover(store);
  return 0;
}
