#include "log_watcher.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "bus_guard.h"
#include "daemon_log.h"
#include "host_time.h"
#include "meta_store.h"

namespace hvtrace::hostd {

void LogWatcher::KeepOnly(const std::vector<std::string>& names) {
  const std::set<std::string> present(names.begin(), names.end());
  std::erase_if(vms_, [&](const auto& entry) { return !present.contains(entry.first); });
}

nlohmann::json LogWatcher::Watched::Status() const {
  nlohmann::json s = {{"looks", looks},         {"last_ms", last_ms}, {"max_ms", max_ms},
                      {"new_lines", new_lines}, {"oops", oops},       {"warn", warn}};
  if (!formats_from.empty()) s["formats"] = formats_from;
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
  Result<std::shared_ptr<const KernelFormats>> formats =
      FormatsFor(vm.name(), range->kernel_key, watched);
  if (!formats.ok()) {
    Note(vm.name(), watched, formats.error().message + ": not watched");
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

Result<std::shared_ptr<const KernelFormats>> LogWatcher::FormatsFor(const std::string& vm,
                                                                    const std::string& kernel_key,
                                                                    Watched& watched) {
  std::string cache_state = "the kernel is not known";
  if (!kernel_key.empty() && formats_) {
    Result<std::shared_ptr<const KernelFormats>> got = formats_->Get(kernel_key);
    if (got.ok() && *got) {
      watched.formats_from = "cache " + kernel_key;
      return got;
    }
    cache_state = "formats " + kernel_key + " " +
                  (got.ok() ? "not cached (yet)" : "unreadable: " + got.error().message);
  }
  Result<std::shared_ptr<const KernelFormats>> channel = ChannelFormats(vm, watched);
  if (channel.ok()) return channel;
  return Error{cache_state + ", and " + channel.error().message};
}

Result<std::shared_ptr<const KernelFormats>> LogWatcher::ChannelFormats(const std::string& vm,
                                                                        Watched& watched) {
  if (!meta_dir_of_) return Error{"no metadata channel"};
  const MetaStore store(meta_dir_of_(vm));
  Result<std::vector<MetaBootEntry>> boots = store.List();
  if (!boots.ok()) return Error{"metadata channel store: " + boots.error().message};
  if (boots->empty()) return Error{"no boot came over the metadata channel"};
  // The newest boot is the one running: its console lines are the ones
  // watched (a look reads the range's newest boot).
  const MetaBootEntry& newest = boots->back();
  const std::string id = newest.boot_id + " " + newest.key + " " + std::to_string(newest.revision);
  if (id != watched.channel_boot || !watched.channel_formats) {
    Result<KernelFormats> loaded = store.LoadFormats(newest);
    if (!loaded.ok()) {
      return Error{"metadata channel boot " + newest.boot_id + ": " + loaded.error().message};
    }
    watched.channel_formats = std::make_shared<const KernelFormats>(std::move(*loaded));
    watched.channel_boot = id;
  }
  watched.formats_from = "meta channel " + newest.boot_id;
  return watched.channel_formats;
}

}  // namespace hvtrace::hostd
