// The daemon's watch of its running VMs' kernel logs (log_watch.h): config
// log_watch and log_watch_interval. Each round looks at every running VM's
// boot range in turn, on the pool, with one copy buffer for all VMs (the
// rounds never overlap; one VM per pool job), and tells a VM's supervisor what trouble its guest
// logged as an HVTRACE_GUEST_OOPS or HVTRACE_GUEST_WARN event; the
// supervisor schedules the capture as a guest trigger (rate-limited,
// supervisor.h). VMs whose vCPUs are stopped (a panic being captured) are
// left alone, as are VMs with no formats at all. The formats are those a
// capture decodes the newest boot with (boot_range_decode.h): the kernel
// file's from the cache, else the newest boot its agent sent over the
// metadata channel (a libvirt domain booted from its own disk has no kernel
// file hvtraced knows).
#ifndef HVTRACE_HOSTD_DAEMON_LOG_WATCHER_H_
#define HVTRACE_HOSTD_DAEMON_LOG_WATCHER_H_

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats_service.h"
#include "log_watch.h"
#include "page_buffer.h"
#include "supervisor.h"

namespace hvtrace::hostd {

struct LogWatchSettings {
  bool oops = true;  // Report Oops/BUG lines.
  bool warn = true;  // Report WARNING lines.
};

class LogWatcher {
 public:
  // |meta_dir_of| names a VM's metadata channel store (MetaDirOfVm).
  using MetaDirOf = std::function<std::filesystem::path(const std::string& vm)>;
  LogWatcher(std::shared_ptr<FormatsService> formats, MetaDirOf meta_dir_of)
      : formats_(std::move(formats)), meta_dir_of_(std::move(meta_dir_of)) {}

  // One look at |vm| when it runs (blocking: call it on the pool, never two
  // at once). The daemon looks at one VM per pool job, so a capture never
  // waits for a whole round.
  void LookAt(VmSupervisor& vm, LogWatchSettings settings);
  // Drops what was kept for VMs not in |names| (after a round).
  void KeepOnly(const std::vector<std::string>& names);

 private:
  struct Watched {
    KernelLogWatch watch;
    std::string range;       // The file and offset watched: a new one starts afresh.
    std::string last_error;  // Logged once until it changes.
    uint64_t looks = 0, new_lines = 0, oops = 0, warn = 0;
    double last_ms = 0, max_ms = 0;  // Copy and look, on the pool.
    // The channel boot whose formats are loaded ("boot_id key revision"),
    // so a look does not parse them again.
    std::string channel_boot;
    std::shared_ptr<const KernelFormats> channel_formats;
    std::string formats_from;  // "cache KEY" or "meta channel BOOT_ID".
    nlohmann::json Status() const;
  };
  // The look itself; false (the reason logged once) when the VM cannot be
  // looked at now.
  bool Look(VmSupervisor& vm, Watched& watched, LogWatchSettings settings);
  void Note(const std::string& vm, Watched& watched, const std::string& error);
  // The formats to read the newest boot with, or why there are none.
  Result<std::shared_ptr<const KernelFormats>> FormatsFor(const std::string& vm,
                                                          const std::string& kernel_key,
                                                          Watched& watched);
  Result<std::shared_ptr<const KernelFormats>> ChannelFormats(const std::string& vm,
                                                              Watched& watched);

  std::shared_ptr<FormatsService> formats_;
  MetaDirOf meta_dir_of_;
  std::map<std::string, Watched> vms_;
  PageBuffer copy_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_DAEMON_LOG_WATCHER_H_
