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
  if (map->boots != boots_) seen_ns_.clear();
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
  for (const KernelLogRecord& r : log.records) {
    const std::string_view trouble = TroubleOfLine(r.text);
    if (trouble == "panic") look.panic_seen = true;
    if (trouble != "oops" && trouble != "warn") continue;
    ++look.trouble_lines;
    // The first line of each kind: an oops prints a BUG line, then its
    // Oops line; a WARN storm one WARNING after another.
    const bool have = std::any_of(look.troubles.begin(), look.troubles.end(),
                                  [&](const LogTrouble& t) { return t.trigger == trouble; });
    if (!have)
      look.troubles.push_back(
          {std::string(trouble), PrintableLogText(r.text), newest, r.cpu, r.ts_ns});
  }
  if (look.panic_seen) look.troubles.clear();
  return look;
}

}  // namespace hvtrace::hostd
