// Fuzzes the kernel log readers over guest bytes: printk:console records
// (KernelLogFromConsoleEvents: the __data_loc reference, NULs, newlines,
// lengths) and the crash summary over any text (SummarizeCrash: line shapes,
// numbers, frames), then the printable forms.
// Input: records as [u16 little-endian length][payload] one after the other
// (the seeds: the 6.12 guest's real panic lines, tests/fixtures/kernel-log/,
// as printk:console records in that kernel's layout, and the KERN_CONT
// pieces of an oops line); the same bytes, split at newlines, are also a
// log. Seeds: tests/fixtures/fuzz/kernel_log/.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "hvtrace/console_log.h"
#include "hvtrace/crash_summary.h"
#include "hvtrace/kernel_log.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  std::vector<hvtrace::ConsoleEventRecord> records;
  for (size_t at = 0; at + 2 <= size;) {
    const size_t len = data[at] | (size_t{data[at + 1]} << 8);
    at += 2;
    const size_t n = len < size - at ? len : size - at;
    records.push_back({at, static_cast<int32_t>(records.size() % 4), {bytes + at, n}});
    at += n;
  }
  // The guests' printk:console ids differ: the first record's type is it
  // (offset 8 is every kernel's).
  uint32_t id = 0;
  if (!records.empty() && records[0].payload.size() >= 2) id = data[2] | (uint32_t{data[3]} << 8);
  const hvtrace::ConsoleMsgField field{id, 8};
  const hvtrace::KernelLog log = hvtrace::KernelLogFromConsoleEvents(field, records);
  const hvtrace::CrashSummary s = hvtrace::SummarizeCrash(log);
  size_t sum = hvtrace::DmesgText(log).size() + s.frames.size() + s.reason.size();

  hvtrace::KernelLog lines;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  while (!text.empty() && lines.records.size() < 100000) {
    const size_t nl = text.find('\n');
    lines.records.push_back({.text = std::string(text.substr(0, nl))});
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  const std::string kallsyms = "ffffffff81000000 T _text\nffffffff81000100 T f\n";
  const auto table = hvtrace::KallsymsTable::Parse(kallsyms);
  const hvtrace::CrashSummary t = hvtrace::SummarizeCrash(lines, {table.get(), kallsyms, 0});
  sum += t.frames.size() + hvtrace::PrintableLogText(t.cpu_line).size();
  return sum == 1 ? 1 : 0;
}
