#include "hvtrace/console_log.h"

#include <algorithm>
#include <cstring>
#include <string_view>

namespace hvtrace {
namespace {

// struct trace_entry: u16 common_type, u8 flags, u8 preempt_count, s32 pid.
constexpr size_t kEntryHeader = 8;

// Lines the kernel prints in pieces (KERN_CONT): printk_sprint strips the
// continuation flag before trace_console, so each piece is an event of its
// own. The oops lines built so end with pr_cont("\n"), an empty event:
// print_modules() ("Modules linked in:" then " name" per module) and
// dump_pagetable() ("PGD 0 " then "P4D 0 "). Their pieces, from the same
// CPU and task, are joined up to that empty event, as dmesg shows them.
constexpr std::string_view kContinuedLines[] = {"Modules linked in:", "PGD "};
constexpr size_t kMaxPieces = 512;

struct OpenLine {
  bool open = false;
  int32_t cpu = -1, pid = -1;
  size_t pieces = 0;
  bool cut = false;  // Counted in |truncated| once.
};

// Appends |text| to the open line when it is one of its pieces; false when
// the record is a line of its own.
bool Continue(const ConsoleEventRecord& rec, int32_t pid, std::string_view text, OpenLine* line,
              KernelLog* log) {
  if (!line->open || log->records.empty()) return false;
  if (rec.cpu != line->cpu || pid != line->pid || text.find('\n') != std::string_view::npos ||
      line->pieces >= kMaxPieces) {
    line->open = false;
    return false;
  }
  line->pieces++;
  if (text.empty()) {
    line->open = false;  // pr_cont("\n"): the line is whole.
    return true;
  }
  std::string& last = log->records.back().text;
  const size_t room = kMaxKernelLogLine - std::min(last.size(), kMaxKernelLogLine);
  if (text.size() > room) {
    if (!line->cut) log->truncated++;
    line->cut = true;
    text = text.substr(0, room);
  }
  last.append(text);
  return true;
}

void AppendLines(const ConsoleEventRecord& rec, int32_t pid, std::string_view text,
                 KernelLog* log) {
  while (true) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    if (!(nl != std::string_view::npos && nl + 1 == text.size() && line.empty())) {
      if (log->records.size() >= kMaxConsoleLogLines) {
        log->malformed++;
        return;
      }
      KernelLogRecord r;
      r.ts_ns = rec.ts_ns;
      r.cpu = rec.cpu;
      r.pid = pid;
      if (line.size() > kMaxKernelLogLine) {
        line = line.substr(0, kMaxKernelLogLine);
        log->truncated++;
      }
      r.text.assign(line);
      log->records.push_back(std::move(r));
    }
    if (nl == std::string_view::npos || nl + 1 == text.size()) return;
    text.remove_prefix(nl + 1);
  }
}

}  // namespace

std::optional<ConsoleMsgField> FindConsoleMsgField(const EventFormat& format) {
  if (format.system != "printk" || format.name != "console") return std::nullopt;
  const FieldFormat* msg = format.FindField("msg");
  if (msg == nullptr || msg->kind != FieldKind::kDataLoc || msg->size != 4) return std::nullopt;
  return ConsoleMsgField{format.id, msg->offset};
}

KernelLog KernelLogFromConsoleEvents(const ConsoleMsgField& field,
                                     std::span<const ConsoleEventRecord> records) {
  KernelLog log;
  log.source = "console-events";
  OpenLine line;
  for (const ConsoleEventRecord& rec : records) {
    const std::span<const std::byte> p = rec.payload;
    uint16_t type = 0;
    if (p.size() < sizeof(type)) continue;
    std::memcpy(&type, p.data(), sizeof(type));
    if (type != field.id) continue;
    uint32_t ref = 0;
    if (p.size() < kEntryHeader || field.offset > p.size() || p.size() - field.offset < 4) {
      log.malformed++;
      continue;
    }
    int32_t pid = 0;
    std::memcpy(&pid, p.data() + 4, sizeof(pid));
    std::memcpy(&ref, p.data() + field.offset, sizeof(ref));
    const size_t start = ref & 0xffff, len = ref >> 16;
    if (start < kEntryHeader || start > p.size() || p.size() - start < len) {
      log.malformed++;
      continue;
    }
    std::string_view text(reinterpret_cast<const char*>(p.data() + start), len);
    text = text.substr(0, text.find('\0'));
    if (Continue(rec, pid, text, &line, &log)) continue;
    AppendLines(rec, pid, text, &log);
    line.open = std::any_of(std::begin(kContinuedLines), std::end(kContinuedLines),
                            [&](std::string_view opener) { return text.starts_with(opener); }) &&
                text.find('\n') == std::string_view::npos;
    line.cpu = rec.cpu;
    line.pid = pid;
    line.pieces = 0;
    line.cut = false;
  }
  return log;
}

}  // namespace hvtrace
