#include "log_watch.h"

#include <algorithm>
#include <optional>

#include "crash_step.h"
#include "hvtrace/boot_map.h"
#include "hvtrace/console_log.h"
#include "hvtrace/crash_summary.h"
#include "hvtrace/kernel_log.h"
#include "hvtrace/page.h"

namespace hvtrace::hostd {

LogLook KernelLogWatch::Look(std::span<const std::byte> range, const KernelFormats& formats,
                             int cpus) {
  LogLook look;
  const std::optional<ConsoleMsgField> field = ConsoleField(formats);
  if (!field) {
    look.error = "kernel " + formats.key + " has no printk:console event to watch";
    return look;
  }
  Result<PageLayout> layout = PageLayout::FromHeaderPage(formats.header_page, 4096);
  if (!layout.ok()) {
    look.error = "formats " + formats.key + ": header_page: " + layout.error().message;
    return look;
  }
  Result<BootMap> map = ReadBootMap(range, BootMapOptions{.cpus = cpus, .layout = *layout});
  if (!map.ok()) {
    look.error = "boot range of " + std::to_string(range.size()) + " bytes: " + map.error().message;
    return look;
  }
  if (map->boots == 0) return look;
  const uint32_t newest = map->boots - 1;
  // A new boot (kexec, reboot) is read from its start.
  if (map->boots != boots_) {
    seen_ns_.clear();
    open_oops_.reset();
  }
  boots_ = map->boots;

  std::vector<ConsoleEventRecord> fresh;
  for (const BootMapCpu& c : map->cpu) {
    uint64_t& seen = seen_ns_[c.cpu];
    // The newest boot's clock behind what was seen: the guest started over
    // in a range of as many boots (a reset that wiped the range, the VM
    // booted again on the same file): read it from its start.
    uint64_t newest_ns = 0;
    for (const BootMapRecord& rec : c.records) {
      if (rec.boot == newest) newest_ns = std::max(newest_ns, rec.timestamp);
    }
    if (newest_ns < seen) seen = 0;
    const uint64_t before = seen;
    for (const BootMapRecord& rec : c.records) {
      if (rec.boot != newest || RecordEventId(rec.payload) != field->id) continue;
      if (before != 0 && rec.timestamp <= before) continue;
      fresh.push_back({rec.timestamp, c.cpu, rec.payload});
      seen = std::max(seen, rec.timestamp);
    }
  }
  std::stable_sort(fresh.begin(), fresh.end(),
                   [](const auto& a, const auto& b) { return a.ts_ns < b.ts_ns; });
  const KernelLog log = KernelLogFromConsoleEvents(*field, fresh);
  look.new_lines = log.records.size();
  for (const KernelLogRecord& r : log.records) Take(r.text, newest, r.cpu, r.ts_ns, look);
  if (open_oops_ && ++open_looks_ > kOopsWaitLooks) {
    look.troubles.push_back(std::move(*open_oops_));
    open_oops_.reset();
  }
  if (look.panic_seen) {
    look.troubles.clear();
    open_oops_.reset();
  }
  std::stable_sort(look.troubles.begin(), look.troubles.end(),
                   [](const LogTrouble& a, const LogTrouble& b) { return a.ts_ns < b.ts_ns; });
  return look;
}

void KernelLogWatch::Take(const std::string& line, uint32_t boot, int32_t cpu, uint64_t ts_ns,
                          LogLook& look) {
  const auto have = [&](std::string_view kind) {
    return std::any_of(look.troubles.begin(), look.troubles.end(),
                       [&](const LogTrouble& t) { return t.trigger == kind; });
  };
  if (open_oops_ && line.find("---[ end trace") != std::string::npos) {
    if (!have("oops")) look.troubles.push_back(std::move(*open_oops_));
    open_oops_.reset();
    return;
  }
  const std::string_view trouble = TroubleOfLine(line);
  if (trouble == "panic") look.panic_seen = true;
  if (trouble != "oops" && trouble != "warn") return;
  ++look.trouble_lines;
  // The first line of each kind: an oops prints a BUG line, then its Oops
  // line; a WARN storm one WARNING after another.
  if (trouble == "warn") {
    if (!have("warn")) look.troubles.push_back({"warn", PrintableLogText(line), boot, cpu, ts_ns});
  } else if (!open_oops_ && !have("oops")) {
    open_oops_ = LogTrouble{"oops", PrintableLogText(line), boot, cpu, ts_ns};
    open_looks_ = 0;
  }
}

}  // namespace hvtrace::hostd
