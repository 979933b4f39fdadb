#include "log_watcher.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "bus_guard.h"
#include "daemon_log.h"
#include "host_time.h"

namespace hvtrace::hostd {

void LogWatcher::KeepOnly(const std::vector<std::string>& names) {
  const std::set<std::string> present(names.begin(), names.end());
  std::erase_if(vms_, [&](const auto& entry) { return !present.contains(entry.first); });
}

nlohmann::json LogWatcher::Watched::Status() const {
  nlohmann::json s = {{"looks", looks},         {"last_ms", last_ms}, {"max_ms", max_ms},
                      {"new_lines", new_lines}, {"oops", oops},       {"warn", warn}};
  if (!last_error.empty()) s["error"] = last_error;
  return s;
}

void LogWatcher::Note(const std::string& vm, Watched& watched, const std::string& error) {
  if (error == watched.last_error) return;
  watched.last_error = error;
  if (!error.empty()) LogInfo("VM " + vm + ": kernel log watch: " + error);
}

void LogWatcher::LookAt(VmSupervisor& vm, LogWatchSettings settings) {
  Watched& watched = vms_[vm.name()];
  const auto start = std::chrono::steady_clock::now();
  if (Look(vm, watched, settings)) {
    watched.last_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    watched.max_ms = std::max(watched.max_ms, watched.last_ms);
  }
  vm.SetLogWatchStatus(watched.Status());
}

bool LogWatcher::Look(VmSupervisor& vm, Watched& watched, LogWatchSettings settings) {
  // Stopped vCPUs (a panic, a pause) log nothing new; a panic's capture
  // reads the log itself.
  if (vm.state() != VmState::kRunning || vm.backend() == nullptr) return false;
  const std::optional<RegionFileSource> range = vm.backend()->boot_range();
  if (!range || !range->file || !range->boot_range) return false;
  const std::string id = range->path.string() + "@" + std::to_string(range->offset);
  if (id != watched.range) {
    watched.watch = KernelLogWatch();
    watched.range = id;
  }
  if (range->kernel_key.empty() || !formats_) {
    Note(vm.name(), watched, "the kernel is not known (no formats): not watched");
    return false;
  }
  Result<std::shared_ptr<const KernelFormats>> formats = formats_->Get(range->kernel_key);
  if (!formats.ok() || !*formats) {
    Note(vm.name(), watched,
         "formats " + range->kernel_key + " " +
             (formats.ok() ? "not cached (yet)" : "unreadable: " + formats.error().message) +
             ": not watched");
    return false;
  }
  const std::span<const std::byte> mapped = range->file->mapped(range->offset, range->size);
  if (mapped.empty() || !copy_.Resize(range->size) ||
      !GuardedCopy(copy_.span().data(), mapped.data(), mapped.size())) {
    Note(vm.name(), watched,
         "cannot copy the boot range " + range->path.string() + " (" + std::to_string(range->size) +
             " bytes at " + std::to_string(range->offset) + ")");
    return false;
  }
  const LogLook look = watched.watch.Look(copy_.span(), **formats, 0);
  ++watched.looks;
  watched.new_lines += look.new_lines;
  Note(vm.name(), watched, look.error);
  for (const LogTrouble& t : look.troubles) {
    if (t.trigger == "oops" ? !settings.oops : !settings.warn) continue;
    ++(t.trigger == "oops" ? watched.oops : watched.warn);
    vm.OnVmEvent(VmEvent{t.trigger == "oops" ? "HVTRACE_GUEST_OOPS" : "HVTRACE_GUEST_WARN",
                         {{"line", t.line},
                          {"boot", t.boot},
                          {"cpu", t.cpu},
                          {"ts_ns", t.ts_ns},
                          {"trouble_lines_in_look", look.trouble_lines}},
                         HostTime::Now()});
  }
  return true;
}

}  // namespace hvtrace::hostd
