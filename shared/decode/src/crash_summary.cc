#include "hvtrace/crash_summary.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>

namespace hvtrace {
namespace {

// How far the pieces of one crash lie apart, in lines: an oops before its
// panic prints registers, code bytes, a call trace and the module list
// (~60 lines); sysrq's panic dumps the stack after the panic line.
constexpr size_t kMaxBlockLines = 400;

constexpr std::string_view kPanicPrefix = "Kernel panic - not syncing: ";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

bool IsOopsLine(std::string_view t) { return t.starts_with("Oops: "); }
bool IsBugLine(std::string_view t) {
  return t.starts_with("BUG: ") || t.starts_with("kernel BUG at ") ||
         t.starts_with("general protection fault");
}
// __warn()'s first line. Up to 6.18: "WARNING: CPU: 0 PID: 209 at FILE:LINE
// FUNC"; 6.19+ (7.x): "WARNING: FILE:LINE at FUNC, CPU#0: COMM/209", or
// "WARNING: at FUNC, CPU#0: COMM/209" without a file. Other printks start
// with "WARNING: " too (boot-time notices), so the 7.x form is matched by its
// whole tail: ", CPU#" digits ": " COMM "/" digits at the end.
bool IsWarnLine(std::string_view t) {
  if (t.starts_with("WARNING: CPU: ")) return true;
  if (!t.starts_with("WARNING: ")) return false;
  const size_t cpu = t.rfind(", CPU#");
  if (cpu == std::string_view::npos) return false;
  const std::string_view head = t.substr(9, cpu - 9);
  if (!head.starts_with("at ") && head.find(" at ") == std::string_view::npos) return false;
  std::string_view tail = t.substr(cpu + 6);
  const auto digits = [](std::string_view d) {
    return !d.empty() && d.find_first_not_of("0123456789") == std::string_view::npos;
  };
  const size_t colon = tail.find(": ");
  const size_t slash = tail.rfind('/');
  return colon != std::string_view::npos && slash != std::string_view::npos && slash > colon &&
         digits(tail.substr(0, colon)) && digits(tail.substr(slash + 1));
}
bool IsTroubleLine(std::string_view t) { return IsOopsLine(t) || IsBugLine(t) || IsWarnLine(t); }

std::optional<int64_t> Number(std::string_view s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end == s.data()) return std::nullopt;
  return v;
}

// The number after |key| in |line| ("PID: 209" -> 209).
std::optional<int64_t> NumberAfter(std::string_view line, std::string_view key) {
  const size_t at = line.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  return Number(line.substr(at + key.size()));
}

// "CPU: 1 UID: 0 PID: 209 Comm: sh Not tainted 6.12.48+deb12-amd64 #1 ..."
// (6.12 and 7.x; without "UID:" before 6.11). Comm is up to 15 bytes and may
// hold spaces: it ends where " Not tainted" or " Tainted: " begins.
bool ParseCpuLine(std::string_view t, CrashSummary* s) {
  if (!t.starts_with("CPU: ") || t.find(" PID: ") == std::string_view::npos) return false;
  const size_t comm = t.find(" Comm: ");
  if (comm == std::string_view::npos) return false;
  const auto cpu = NumberAfter(t, "CPU: ");
  const auto pid = NumberAfter(t, " PID: ");
  if (!cpu || !pid || *cpu < 0 || *cpu > INT32_MAX || *pid < 0 || *pid > INT32_MAX) return false;
  s->cpu = static_cast<int32_t>(*cpu);
  s->pid = static_cast<int32_t>(*pid);
  std::string_view rest = t.substr(comm + 7);
  size_t end = rest.find(" Not tainted");
  if (end != std::string_view::npos) {
    s->taint = "not tainted";
  } else if ((end = rest.find(" Tainted: ")) != std::string_view::npos) {
    // "Tainted: G      D      6.12..." : the flags run up to the release.
    std::string_view flags = rest.substr(end + 10);
    size_t release = 0;
    while (release < flags.size()) {
      const size_t sp = flags.find(' ', release);
      const char c = flags[release];
      if (c >= '0' && c <= '9') break;
      if (sp == std::string_view::npos) {
        release = flags.size();
        break;
      }
      release = sp + 1;
    }
    if (s->taint.empty()) s->taint = PrintableLogText(Trim(flags.substr(0, release)));
  }
  s->task = PrintableLogText(rest.substr(0, std::min(end, size_t{15})));
  s->cpu_line = PrintableLogText(t);
  return true;
}

// "name+0xoff/0xsize" or "0xffffffff81234567" / "[<ffffffff81234567>]".
bool LooksLikeSymbol(std::string_view f) {
  const size_t plus = f.rfind('+');
  return plus != std::string_view::npos && plus > 0 && f.substr(plus).starts_with("+0x") &&
         f.find(' ') == std::string_view::npos;
}

std::optional<uint64_t> RawAddress(std::string_view f) {
  if (f.starts_with("[<") && f.ends_with(">]")) {
    f = f.substr(2, f.size() - 4);
  } else if (f.starts_with("0x")) {
    f.remove_prefix(2);
  } else {
    return std::nullopt;
  }
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), v, 16);
  if (ec != std::errc() || end != f.data() + f.size() || f.empty()) return std::nullopt;
  return v;
}

std::string Symbolize(uint64_t addr, const CrashSymbolizer& sym) {
  if (sym.table == nullptr) return std::string();
  const uint64_t want = addr - static_cast<uint64_t>(sym.delta);
  const auto symbols = sym.table->symbols();
  auto it = std::upper_bound(symbols.begin(), symbols.end(), want,
                             [](uint64_t a, const KallsymsTable::Symbol& s) { return a < s.addr; });
  while (it != symbols.begin()) {
    --it;
    if (it->module || it->addr == 0) continue;
    const uint64_t off = want - it->addr;
    if (off > (1u << 20)) return std::string();  // Past any function: not a text address.
    char hex[32];
    std::snprintf(hex, sizeof hex, "+0x%llx", static_cast<unsigned long long>(off));
    return std::string(KallsymsTable::Name(sym.kallsyms, *it)) + hex;
  }
  return std::string();
}

// One call-trace line; false when it is no frame (the trace ended).
bool ParseFrame(std::string_view t, const std::string& context, const CrashSymbolizer& sym,
                CrashFrame* frame) {
  frame->context = context;
  if (t.starts_with("? ")) {
    frame->unreliable = true;
    t = Trim(t.substr(2));
  }
  std::string_view fn = t;
  if (const size_t sp = t.find(' '); sp != std::string_view::npos) {
    fn = t.substr(0, sp);
    std::string_view mod = Trim(t.substr(sp + 1));
    if (!(mod.size() > 2 && mod.front() == '[' && mod.back() == ']')) return false;
    frame->module = PrintableLogText(mod.substr(1, mod.size() - 2));
  }
  if (const auto addr = RawAddress(fn)) {
    frame->function = PrintableLogText(fn);
    if (std::string name = Symbolize(*addr, sym); !name.empty()) {
      frame->function = std::move(name);
      frame->symbolized = true;
    }
    return true;
  }
  if (!LooksLikeSymbol(fn)) return false;
  frame->function = PrintableLogText(fn);
  return true;
}

// Reads the call trace that starts after line |i| ("Call Trace:").
void ReadFrames(const KernelLog& log, size_t i, const CrashSymbolizer& sym, CrashSummary* s) {
  std::string context = "TASK";
  for (size_t k = i + 1; k < log.records.size() && k < i + kMaxBlockLines; ++k) {
    const std::string_view t = Trim(log.records[k].text);
    if (t == "</TASK>") return;
    if (t.size() > 2 && t.front() == '<' && t.back() == '>') {
      // <IRQ> ... </IRQ>, <NMI>, <SOFTIRQ>: the stack the frames below ran on.
      context = t[1] == '/' ? "TASK" : std::string(t.substr(1, t.size() - 2));
      continue;
    }
    CrashFrame frame;
    if (!ParseFrame(t, context, sym, &frame)) return;
    if (s->frames.size() >= kMaxCrashFrames) {
      s->frames_dropped++;
      continue;
    }
    s->frames.push_back(std::move(frame));
  }
}

// The block's first line: the oops/BUG/WARNING line nearest before |anchor|
// and the lines of that same burst before it (a BUG line precedes its
// Oops line), or |anchor| itself.
size_t BlockStart(const KernelLog& log, size_t anchor) {
  size_t start = anchor;
  const size_t floor = anchor > kMaxBlockLines ? anchor - kMaxBlockLines : 0;
  for (size_t k = anchor; k-- > floor;) {
    const std::string_view t = Trim(log.records[k].text);
    if (t.starts_with(kPanicPrefix)) break;  // An earlier panic is another crash.
    if (IsTroubleLine(t)) {
      start = k;
      // Keep going only while the burst continues (BUG right before Oops).
      const size_t stop = k > 12 ? k - 12 : 0;
      bool more = false;
      for (size_t j = k; j-- > stop;) more |= IsTroubleLine(Trim(log.records[j].text));
      if (!more) break;
    }
  }
  return start;
}

void ReadBlock(const KernelLog& log, size_t start, size_t end, const CrashSymbolizer& sym,
               CrashSummary* s) {
  bool trace = false, cpu = false;
  for (size_t k = start; k < end; ++k) {
    const std::string_view t = Trim(log.records[k].text);
    if (s->bug_line.empty() && IsBugLine(t)) s->bug_line = PrintableLogText(t);
    if (s->oops_line.empty() && IsOopsLine(t)) s->oops_line = PrintableLogText(t);
    if (s->warning_line.empty() && IsWarnLine(t)) s->warning_line = PrintableLogText(t);
    if (!cpu) cpu = ParseCpuLine(t, s);
    if (t.starts_with("Tainted: ")) s->taint = PrintableLogText(t.substr(9));
    // The exception's RIP comes before its call trace; a RIP inside the
    // trace is the user registers of the syscall the task was in.
    if (!trace && s->rip.empty() && t.starts_with("RIP: "))
      s->rip = PrintableLogText(Trim(t.substr(5)));
    if (s->kernel_offset.empty() && t.starts_with("Kernel Offset: ")) {
      std::string_view off = t.substr(15);
      s->kernel_offset = PrintableLogText(off.substr(0, off.find(' ')));
    }
    if (!trace && t == "Call Trace:") {
      trace = true;
      ReadFrames(log, k, sym, s);
    }
  }
}

}  // namespace

std::string_view TroubleOfLine(std::string_view text) {
  const std::string_view t = Trim(text);
  if (t.starts_with(kPanicPrefix)) return "panic";
  if (IsOopsLine(t) || IsBugLine(t)) return "oops";
  return IsWarnLine(t) ? "warn" : "";
}

std::string_view PanicReason(std::string_view text) {
  text = Trim(text);
  if (!text.starts_with(kPanicPrefix)) return {};
  return Trim(text.substr(kPanicPrefix.size()));
}

CrashSummary SummarizeCrash(const KernelLog& log, const CrashSymbolizer& symbols) {
  CrashSummary s;
  const size_t n = log.records.size();
  std::optional<size_t> panic, trouble;
  for (size_t k = n; k-- > 0;) {
    const std::string_view t = Trim(log.records[k].text);
    if (t.starts_with(kPanicPrefix)) {
      panic = k;
      break;
    }
    if (!trouble && IsTroubleLine(t)) trouble = k;
  }
  if (!panic && !trouble) return s;
  s.found = true;
  const size_t anchor = panic ? *panic : *trouble;
  const size_t start = BlockStart(log, anchor);
  const std::string_view anchor_text = Trim(log.records[anchor].text);
  if (panic) {
    s.kind = "panic";
    s.panic_line = PrintableLogText(anchor_text);
    s.reason = PrintableLogText(anchor_text.substr(kPanicPrefix.size()));
  }
  // After a panic the stack dump follows the panic line; an oops's comes
  // before it.
  const size_t end = std::min(n, std::max(anchor, start) + kMaxBlockLines);
  ReadBlock(log, start, end, symbols, &s);
  if (!panic) {
    const bool warn = IsWarnLine(anchor_text) && s.oops_line.empty() && s.bug_line.empty();
    s.kind = warn ? "warn" : "oops";
    s.reason = warn ? s.warning_line : (s.bug_line.empty() ? s.oops_line : s.bug_line);
  }
  if (s.cpu < 0) s.cpu = log.records[start].cpu;
  if (s.pid < 0) s.pid = log.records[start].pid;
  s.ts_ns = log.records[start].ts_ns;
  s.first_line = start;
  return s;
}

}  // namespace hvtrace
