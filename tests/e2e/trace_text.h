// Parsing trace text for comparisons in e2e tests: the guest's own
// tracefs `trace` file and `trace-cmd report` / `hvtrace show` text, reduced
// to what both print the same way. The allowed differences (the same as in
// tests/unit/capture_pipeline_test.cc, reasons in capture_pipeline.h):
//  - task names are not compared: the boot buffer has no saved_cmdlines;
//  - latency columns are not compared: trace-cmd prints them only with -l;
//  - sched_switch: the kernel's print fmt vs libtraceevent's plugin
//    ("A:1 [120] S ==> B:2 [120]"); states past R/S/D compare as "?";
//  - sched_wakeup: the kernel's "comm=A pid=1 prio=120 target_cpu=000" vs
//    the plugin's "A:1 [120] CPU:000";
//  - hrtimer_expire_entry: the kernel's "hrtimer=P function=F now=N" vs the
//    plugin's "hrtimer=P now=N function=F/0x0";
//  - print events: "tracing_mark_write: X" vs "print: tracing_mark_write: X";
//  - %p values: the guest prints "(____ptrval____)" until its pointer-hash
//    key is ready, trace-cmd the raw value: such a field matches any value
//    (SameEvent);
//  - runs of spaces are collapsed.
#ifndef HVTRACE_TESTS_E2E_TRACE_TEXT_H_
#define HVTRACE_TESTS_E2E_TRACE_TEXT_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <regex>
#include <string>
#include <vector>

namespace hvtrace::e2e {

struct TraceEvent {
  int cpu = 0;
  int pid = 0;
  std::string usecs;  // "12.345678"
  std::string name;   // "sched_switch"
  std::string text;   // What follows "name: ", normalized.
  bool operator==(const TraceEvent&) const = default;
};

inline std::ostream& operator<<(std::ostream& os, const TraceEvent& e) {
  return os << "[" << e.cpu << "] pid " << e.pid << " " << e.usecs << " " << e.name << ": "
            << e.text;
}

inline std::vector<std::string> TextLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(start, nl - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    start = nl + 1;
  }
  return lines;
}

inline std::string CollapseSpaces(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ' ' && (out.empty() || out.back() == ' ')) continue;
    out += c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

inline std::string PluginState(const std::string& state) {
  return state == "R" || state == "S" || state == "D" ? state : "?";
}

// Lines of the guest's instances/<name>/trace file; other lines (the shell's
// echo, kernel messages on the console) are skipped.
//   "          <idle>-0       [000] d.h2.     0.000000: irq_handler_entry: irq=0 name=timer"
inline std::vector<TraceEvent> GuestTraceEvents(const std::string& text) {
  static const std::regex kLine(
      R"(^\s*.+-(\d+)\s+\[(\d+)\]\s+\S+\s+(\d+\.\d{6}): ([a-z_0-9]+): ?(.*)$)");
  static const std::regex kSwitch(
      R"(^prev_comm=(.*) prev_pid=(\d+) prev_prio=(\d+) prev_state=(\S+) ==> )"
      R"(next_comm=(.*) next_pid=(\d+) next_prio=(\d+)$)");
  std::vector<TraceEvent> out;
  for (const std::string& line : TextLines(text)) {
    std::smatch m;
    if (line.empty() || line[0] == '#' || !std::regex_match(line, m, kLine)) continue;
    TraceEvent e{std::stoi(m[2]), std::stoi(m[1]), m[3], m[4], CollapseSpaces(m[5])};
    std::smatch sw;
    if (e.name == "sched_switch" && std::regex_match(e.text, sw, kSwitch)) {
      std::string state = sw[4];
      if (state.ends_with("+")) state.pop_back();
      e.text = std::string(sw[1]) + ":" + std::string(sw[2]) + " [" + std::string(sw[3]) + "] " +
               PluginState(state) + " ==> " + std::string(sw[5]) + ":" + std::string(sw[6]) + " [" +
               std::string(sw[7]) + "]";
    }
    static const std::regex kWakeup(R"(^comm=(.*) pid=(\d+) prio=(\d+) target_cpu=(\d+)$)");
    if (e.name.starts_with("sched_wakeup") && std::regex_match(e.text, sw, kWakeup)) {
      e.text = std::string(sw[1]) + ":" + std::string(sw[2]) + " [" + std::string(sw[3]) +
               "] CPU:" + std::string(sw[4]);
    }
    out.push_back(std::move(e));
  }
  return out;
}

// |guest| (GuestTraceEvents) and |ours| (ReportTraceEvents) are the same
// event apart from the time; a guest field printed as "(____ptrval____)"
// matches any value.
inline bool SameEventText(const TraceEvent& guest, const TraceEvent& ours) {
  if (guest.cpu != ours.cpu || guest.pid != ours.pid || guest.name != ours.name) return false;
  if (guest.text == ours.text) return true;
  static const std::regex kToken(R"(\S+)");
  std::vector<std::string> a, b;
  for (auto it = std::sregex_iterator(guest.text.begin(), guest.text.end(), kToken);
       it != std::sregex_iterator(); ++it)
    a.push_back(it->str());
  for (auto it = std::sregex_iterator(ours.text.begin(), ours.text.end(), kToken);
       it != std::sregex_iterator(); ++it)
    b.push_back(it->str());
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    const size_t eq = a[i].find("=(____ptrval____)");
    if (eq == std::string::npos || a[i].size() != eq + 17 ||
        b[i].compare(0, eq + 1, a[i], 0, eq + 1) != 0)
      return false;
  }
  return true;
}

// The same event at the same time.
inline bool SameEvent(const TraceEvent& guest, const TraceEvent& ours) {
  return guest.usecs == ours.usecs && SameEventText(guest, ours);
}

// "12.345678" -> 12345678 (microseconds).
inline int64_t Usecs(const std::string& usecs) {
  const size_t dot = usecs.find('.');
  if (dot == std::string::npos) return std::stoll(usecs) * 1000000;
  return std::stoll(usecs.substr(0, dot)) * 1000000 + std::stoll(usecs.substr(dot + 1));
}

// How a view of the guest's own trace file compares with a capture.
struct GuestViewComparison {
  size_t lines = 0;
  size_t exact = 0;      // Same event, same time.
  size_t restamped = 0;  // Same event; the guest's time is the kernel iterator's stale one.
  std::vector<std::string> restamped_lines;  // For the log.
  std::vector<std::string> problems;         // Every line not accounted for, and why.
};

// Compares |guest| (one view: the tail of the guest's trace file) with
// |capture| (every event of a capture taken later), CPU by CPU. Per CPU the
// view is a run of consecutive events of that CPU, so it must be a run of
// the capture's events on that CPU with the same pid, name and text, in the
// same order, each at the same time -- except for the kernel's own error:
//
// Linux 6.12's trace-file iterator (rb_advance_iter in
// kernel/trace/ring_buffer.c) returns without adding an event's delta to its
// read_stamp when that event is the last one committed on the page being
// written. When the guest keeps writing while its trace file is read (the
// boot_map instance is not paused by the read), the events committed after
// the iterator caught up are printed with a time that lacks those deltas:
// earlier than the time the ring holds. The first such line on a CPU is
// exactly one delta early (the gap between the two events before it), every
// later one at least as early; the ring, and so the capture, holds the right
// time (the events' own "now=" fields agree with the capture). Those lines
// are counted as |restamped| (until the iterator reaches a new page, whose
// time stamp puts it right again); anything else is a problem.
inline GuestViewComparison CompareGuestView(const std::vector<TraceEvent>& guest,
                                            const std::vector<TraceEvent>& capture) {
  GuestViewComparison out;
  out.lines = guest.size();
  std::vector<int> cpus;
  for (const TraceEvent& g : guest) {
    if (std::find(cpus.begin(), cpus.end(), g.cpu) == cpus.end()) cpus.push_back(g.cpu);
  }
  auto show = [](const TraceEvent& e) {
    return "[" + std::to_string(e.cpu) + "] pid " + std::to_string(e.pid) + " " + e.usecs + " " +
           e.name + ": " + e.text;
  };
  for (int cpu : cpus) {
    std::vector<const TraceEvent*> g, c;
    for (const TraceEvent& e : guest)
      if (e.cpu == cpu) g.push_back(&e);
    for (const TraceEvent& e : capture)
      if (e.cpu == cpu) c.push_back(&e);
    // Where the run starts: the exact match of the view's first line on this
    // CPU (or, when that line is already restamped, its text at a later time).
    size_t start = c.size();
    for (size_t i = 0; i < c.size() && start == c.size(); ++i) {
      if (SameEvent(*g[0], *c[i])) start = i;
    }
    for (size_t i = 0; i < c.size() && start == c.size(); ++i) {
      if (SameEventText(*g[0], *c[i]) && Usecs(c[i]->usecs) >= Usecs(g[0]->usecs)) start = i;
    }
    if (start == c.size()) {
      for (const TraceEvent* e : g) out.problems.push_back("not in the capture: " + show(*e));
      continue;
    }
    int64_t offset = 0;  // How early the guest's time is, once restamped.
    for (size_t i = 0; i < g.size(); ++i) {
      const size_t at = start + i;
      if (at >= c.size() || !SameEventText(*g[i], *c[at])) {
        out.problems.push_back("not the capture's next event on CPU " + std::to_string(cpu) + ": " +
                               show(*g[i]) +
                               (at < c.size() ? "\n    capture has: " + show(*c[at])
                                              : std::string("\n    capture has no more")));
        continue;
      }
      const int64_t early = Usecs(c[at]->usecs) - Usecs(g[i]->usecs);
      if (early == 0) {
        // Right again: the iterator moved on to a new page, whose time
        // stamp resets its read_stamp.
        ++out.exact;
        offset = 0;
        continue;
      }
      // Times are printed rounded to microseconds: allow 2 us either way.
      bool explained = false;
      if (offset == 0 && at >= 2) {
        const int64_t lost = Usecs(c[at - 1]->usecs) - Usecs(c[at - 2]->usecs);
        explained = early > 0 && std::llabs(early - lost) <= 2;
      } else if (offset != 0) {
        explained = early >= offset - 2;
      }
      if (!explained) {
        out.problems.push_back("time differs: guest " + show(*g[i]) + "\n    capture " +
                               show(*c[at]));
        continue;
      }
      offset = early;
      ++out.restamped;
      out.restamped_lines.push_back(show(*g[i]) + " (capture: " + c[at]->usecs + ")");
    }
  }
  return out;
}

// "sec.usec" of a `trace-cmd report` line (with or without trace-cmd 3.3's
// latency column), in ns; 0 when absent.
inline uint64_t LineTimeNs(const std::string& line) {
  static const std::regex re(R"(\]\s+(?:\S{5,6}\s+)?(\d+)\.(\d{6}):)");
  std::smatch m;
  if (!std::regex_search(line, m, re)) return 0;
  return std::stoull(m[1]) * 1000000000ull + std::stoull(m[2]) * 1000ull;
}

// `trace-cmd report` / `hvtrace show` text lines ('#' headers and "cpus="
// skipped); |unparsed| counts the other lines that are not events. The
// latency column after the CPU is trace-cmd 3.3's (Debian 13), and hvtrace's
// when built there ("[001] d..2.  12.000000:"):
//   "           <...>-215   [001]    12.000000: print:                tracing_mark_write: m"
inline std::vector<TraceEvent> ReportTraceEvents(const std::string& text,
                                                 size_t* unparsed = nullptr) {
  static const std::regex kLine(
      R"(^\s*(.+)-(\d+)\s+\[(\d+)\]\s+(?:\S{5,6}\s+)?(\d+\.\d{6}): ([a-z_0-9]+): ?(.*)$)");
  static const std::regex kSwitch(R"(^(.*:\d+ \[\d+\]) (\S+) ==> (.*)$)");
  std::vector<TraceEvent> out;
  for (const std::string& line : TextLines(text)) {
    if (line.empty() || line[0] == '#' || line.starts_with("cpus=")) continue;
    std::smatch m;
    if (!std::regex_match(line, m, kLine)) {
      if (unparsed) ++*unparsed;
      continue;
    }
    TraceEvent e{std::stoi(m[3]), std::stoi(m[2]), m[4], m[5], CollapseSpaces(m[6])};
    std::smatch sw;
    if (e.name == "sched_switch" && std::regex_match(e.text, sw, kSwitch)) {
      e.text = std::string(sw[1]) + " " + PluginState(sw[2]) + " ==> " + std::string(sw[3]);
    }
    static const std::regex kHrtimer(R"(^hrtimer=(\S+) now=(\d+) function=(\S+?)(/0x[0-9a-f]+)?$)");
    if (e.name == "hrtimer_expire_entry" && std::regex_match(e.text, sw, kHrtimer)) {
      e.text = "hrtimer=" + std::string(sw[1]) + " function=" + std::string(sw[3]) +
               " now=" + std::string(sw[2]);
    }
    if (e.name == "print") {
      const size_t colon = e.text.find(": ");
      if (colon != std::string::npos) {
        e.name = e.text.substr(0, colon);
        e.text = e.text.substr(colon + 2);
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_TRACE_TEXT_H_
