#include "crash_step.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <set>
#include <vector>

#include "boot_file_name.h"
#include "host_time.h"
#include "hvtrace/console_log.h"
#include "hvtrace/decoder.h"
#include "hvtrace/format.h"
#include "kernel_symbols.h"
#include "parsed_formats.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

Status WriteText(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
  if (fd < 0) return Error{"cannot create " + path.string() + ": " + std::strerror(errno)};
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return Error{"writing " + path.string() + ": " + std::strerror(err)};
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return Error{"closing " + path.string() + ": " + std::strerror(errno)};
  return {};
}

// The last kCrashEventsBefore events of CPU |cpu| of |boot| up to |ts_ns|,
// the log's own events left out (they are the log), oldest first.
std::vector<const BootMapRecord*> EventsBefore(const BootMap& map, uint32_t boot, int32_t cpu,
                                               uint64_t ts_ns, uint32_t console_id) {
  std::deque<const BootMapRecord*> last;
  for (const BootMapCpu& c : map.cpu) {
    if (c.cpu != cpu) continue;
    for (const BootMapRecord& rec : c.records) {
      if (rec.boot != boot || rec.timestamp > ts_ns || RecordEventId(rec.payload) == console_id)
        continue;
      last.push_back(&rec);
      if (last.size() > kCrashEventsBefore) last.pop_front();
    }
  }
  std::vector<const BootMapRecord*> out(last.begin(), last.end());
  std::stable_sort(out.begin(), out.end(), [](const BootMapRecord* a, const BootMapRecord* b) {
    return a->timestamp < b->timestamp;
  });
  return out;
}

// Prints |records| as `trace-cmd report` does, with a decoder of only the
// formats they need (one trial parse each, not the kernel's ~1,500).
json EventsJson(const BootLogInputs& in, int32_t cpu,
                const std::vector<const BootMapRecord*>& records,
                const std::function<void(const char*)>& split) {
  json out = json::array();
  if (records.empty() || in.writer == nullptr) return out;
  std::set<uint32_t> ids;
  for (const BootMapRecord* r : records) ids.insert(RecordEventId(r->payload));
  TraceMetadata m;
  m.source = "boot " + std::to_string(in.boot);
  m.header_page = in.writer->header_page;
  for (const CachedEventFormat& f : in.formats->events) {
    if (f.parse_error.empty() && ids.contains(f.id))
      m.formats.push_back({f.system, f.text, f.trial_passed});
  }
  // Only the symbols these records need (their own subset prints them as
  // the trace.dat's does, kallsyms_subset.h): libtraceevent indexing the
  // whole boot's subset was 1.8 M of this step's 7.5 M instructions at a
  // 6.12 panic (callgrind of hvtraced).
  if (in.use_symbols && !in.writer->kallsyms.empty()) {
    BootKallsyms subset(in.formats->kallsyms, in.kaslr_delta, SymbolsOf(*in.formats), in.modules);
    for (const BootMapRecord* r : records) subset.AddPayload(r->payload);
    m.kallsyms = subset.Text();
  }
  m.printk_formats = in.writer->printk_formats;
  m.cmdlines = in.writer->cmdlines;
  m.trace_clock = in.writer->trace_clock;
  m.long_size = in.writer->long_size;
  m.page_size = in.writer->page_size;
  auto decoder = EventDecoder::Create(m);
  // Formats the daemon trial-parsed when it loaded them (format_trials.h)
  // need no child here; the others (a guest's own, from its metadata
  // channel) share one trial child, not a fork per format: five forks of
  // hvtraced took 10-15 ms of this step (capture_latency, 2026-12-02).
  // Twenty-odd records: libtraceevent prints them without the compiled
  // printers (the same text), which would cost more to build than they save.
  if (decoder.ok()) {
    (*decoder)->KeepTrialChild(true);
    (*decoder)->SetFastPathsEnabled(false);
  }
  split("events_decoder");
  for (const BootMapRecord* r : records) {
    json e = {{"ts_ns", r->timestamp}, {"cpu", cpu}};
    if (decoder.ok()) {
      std::string line;
      (*decoder)->AppendText(
          {.cpu = static_cast<uint32_t>(cpu), .timestamp = r->timestamp, .payload = r->payload},
          &line);
      while (!line.empty() && line.back() == '\n') line.pop_back();
      e["line"] = PrintableLogText(line);
    } else {
      e["event_id"] = RecordEventId(r->payload);
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

std::optional<ConsoleMsgField> ConsoleField(const KernelFormats& formats) {
  for (const CachedEventFormat& f : formats.events) {
    if (f.system != "printk" || f.name != "console" || !f.parse_error.empty()) continue;
    const ParsedFormat parsed = ParsedFormatOf(formats, f);
    if (parsed->ok()) return FindConsoleMsgField(**parsed);
  }
  return std::nullopt;
}

KernelLog ConsoleLogOfBoot(const BootMap& map, uint32_t boot, const KernelFormats& formats) {
  const std::optional<ConsoleMsgField> field = ConsoleField(formats);
  if (!field) {
    KernelLog none;
    none.source = "console-events";
    return none;
  }
  std::vector<ConsoleEventRecord> records;
  for (const BootMapCpu& c : map.cpu) {
    for (const BootMapRecord& rec : c.records) {
      if (rec.boot == boot && RecordEventId(rec.payload) == field->id)
        records.push_back({rec.timestamp, c.cpu, rec.payload});
    }
  }
  std::stable_sort(records.begin(), records.end(),
                   [](const auto& a, const auto& b) { return a.ts_ns < b.ts_ns; });
  return KernelLogFromConsoleEvents(*field, records);
}

json CrashJson(const CrashSummary& s, const KernelLog& log, uint32_t boot) {
  json frames = json::array();
  for (const CrashFrame& f : s.frames) {
    json j = {{"function", f.function}, {"context", f.context}};
    if (!f.module.empty()) j["module"] = f.module;
    if (f.unreliable) j["unreliable"] = true;
    if (f.symbolized) j["symbolized"] = true;
    frames.push_back(std::move(j));
  }
  json j = {{"boot", boot},
            {"kind", s.kind},
            {"reason", s.reason},
            {"task", s.task},
            {"pid", s.pid},
            {"cpu", s.cpu},
            {"ts_ns", s.ts_ns},
            {"frames", std::move(frames)},
            {"log",
             {{"source", log.source},
              {"lines", log.records.size()},
              {"lost", log.lost},
              {"malformed", log.malformed},
              {"truncated", log.truncated}}}};
  const std::pair<const char*, const std::string*> texts[] = {{"panic_line", &s.panic_line},
                                                              {"bug_line", &s.bug_line},
                                                              {"oops_line", &s.oops_line},
                                                              {"warning_line", &s.warning_line},
                                                              {"cpu_line", &s.cpu_line},
                                                              {"taint", &s.taint},
                                                              {"rip", &s.rip},
                                                              {"kernel_offset", &s.kernel_offset}};
  for (const auto& [key, value] : texts) {
    if (!value->empty()) j[key] = *value;
  }
  if (s.frames_dropped != 0) j["frames_dropped"] = s.frames_dropped;
  return j;
}

Result<BootLogResult> WriteBootKernelLog(const BootLogInputs& in, const fs::path& dir) {
  const auto start = std::chrono::steady_clock::now();
  auto lap = start;
  json parts = json::object();  // ms of each part: where a panic's summary waits.
  auto split = [&](const char* part) {
    const auto now = std::chrono::steady_clock::now();
    parts[part] = MsBetween(lap, now);
    lap = now;
  };
  BootLogResult out;
  const KernelLog console =
      in.ring_log == nullptr ? ConsoleLogOfBoot(*in.map, in.boot, *in.formats) : KernelLog{};
  const KernelLog& log = in.ring_log != nullptr ? *in.ring_log : console;
  if (log.records.empty() && log.malformed == 0) return out;
  split("log");
  out.file = BootFileName(in.boot, kBootKernelLogSuffix);
  if (Status s = WriteText(dir / out.file, DmesgText(log)); !s.ok()) return s.error();
  split("file");
  out.kernel_log = {{"file", out.file}, {"source", log.source},       {"lines", log.records.size()},
                    {"lost", log.lost}, {"malformed", log.malformed}, {"truncated", log.truncated}};
  CrashSymbolizer symbols;
  std::shared_ptr<const KernelSymbols> table;
  if (in.use_symbols && !in.formats->kallsyms.empty()) {
    table = SymbolsOf(*in.formats);
    symbols = {&table->table(), in.formats->kallsyms, in.kaslr_delta};
  }
  const CrashSummary summary = SummarizeCrash(log, symbols);
  split("summary");
  if (summary.found) {
    out.crash = CrashJson(summary, log, in.boot);
    const std::optional<ConsoleMsgField> field = ConsoleField(*in.formats);
    const auto before =
        EventsBefore(*in.map, in.boot, summary.cpu, summary.ts_ns, field ? field->id : UINT32_MAX);
    split("events_find");
    out.crash["events_before"] = EventsJson(in, summary.cpu, before, split);
    split("events_print");
  }
  out.ms = MsBetween(start, std::chrono::steady_clock::now());
  out.kernel_log["ms"] = parts;
  return out;
}

}  // namespace hvtrace::hostd
