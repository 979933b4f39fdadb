#include "vmcore_step.h"

#include <filesystem>
#include <string>
#include <system_error>

#include "host_time.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

// |from| (QEMU's file, perhaps on another file system: the daemon's run
// directory) into the capture as |name|: renamed when it can be, else
// copied (the kernel copies: copy_file_range/sendfile). Written under a
// "*.tmp.*" name first, so a half copy is never listed (capture_store.h);
// Commit fsyncs the finished file.
Status MoveInto(const fs::path& from, const fs::path& dir, const std::string& name) {
  const fs::path tmp = dir / (name + ".tmp.0");
  std::error_code ec;
  fs::rename(from, tmp, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec);
    std::error_code ignored;
    fs::remove(from, ignored);
    if (ec) return Error{"copying " + from.string() + " to " + tmp.string() + ": " + ec.message()};
  }
  fs::rename(tmp, dir / name, ec);
  if (ec) return Error{"renaming " + tmp.string() + ": " + ec.message()};
  return {};
}

}  // namespace

void VmcoreStep(const CaptureInputs& in, PendingCapture& pending, CaptureManifest& manifest) {
  nlohmann::json& info = manifest.extra["vmcore"];
  info = nlohmann::json::object();
  if (!in.dump_guest_memory) {
    info["error"] = "vmcore = on-panic, but this VM's backend cannot dump guest memory";
    return;
  }
  const HostTime start = HostTime::Now();
  Result<fs::path> dumped = in.dump_guest_memory(pending.dir());
  const double dump_ms = MsSince(start);
  info["dump_ms"] = dump_ms;
  if (!dumped.ok()) {
    info["error"] = dumped.error().message;
    return;
  }
  const HostTime moving = HostTime::Now();
  if (Status s = MoveInto(*dumped, pending.dir(), kVmcoreFileName); !s.ok()) {
    info["error"] = s.error().message;
    return;
  }
  std::error_code ec;
  info["file"] = kVmcoreFileName;
  info["format"] = "kdump-zlib";
  info["bytes"] = fs::file_size(pending.dir() / kVmcoreFileName, ec);
  info["move_ms"] = MsSince(moving);
  manifest.extra["timing_ms"]["vmcore"] = MsSince(start);
}

}  // namespace hvtrace::hostd
