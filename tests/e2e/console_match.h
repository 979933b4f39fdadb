// A guest's serial console (the VM's console log: an oracle hvtrace did not
// write) against a capture's kernel log: every kernel line the console
// printed must be in the log, in order. The console log comes out garbled
// (characters doubled or dropped, two lines run together) when the harness's
// reader of the console socket lags, as under the e2e step's load: QEMU's
// serial sends one byte per write, a refused write (EAGAIN) is logged and
// retried, so logged twice, and bytes the guest writes while retries stall
// overflow the UART's FIFO (QEMU chardev/char.c, hw/char/serial.c). So a
// line within a few edits of the log's next lines counts as found, and is
// counted as garbled; the caller bounds how many may be.
#ifndef HVTRACE_TESTS_E2E_CONSOLE_MATCH_H_
#define HVTRACE_TESTS_E2E_CONSOLE_MATCH_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/kernel_log.h"
#include "trace_text.h"

namespace hvtrace::e2e {

// One kernel line: its printed time ("    1.234567") and text.
struct LogLine {
  std::string time;
  std::string text;
  uint64_t seq = 0;
  bool operator==(const LogLine& o) const { return time == o.time && text == o.text; }
};

// "[    1.234567] text" lines (a console, or a dmesg-style log): the kernel's
// own lines, the text made printable as the capture's logs are. Userspace
// output has no such prefix and is left out.
inline std::vector<LogLine> DmesgStyleLines(const std::string& text) {
  std::vector<LogLine> out;
  for (std::string line : TextLines(text)) {
    while (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.size() < 15 || line[0] != '[' || line[13] != ']') continue;
    const std::string time = line.substr(1, 12);
    if (time.find_first_not_of(" 0123456789.") != std::string::npos) continue;
    out.push_back({time, PrintableLogText(line.size() > 15 ? line.substr(15) : ""), 0});
  }
  return out;
}

// Levenshtein distance.
inline size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The second of two console lines the UART ran together: the text after the
// last printk time ("    0.000000] ") inside |text|, whose "[" or more may
// be lost too (CI, 2026-12-03: "...System RAM\x0d\x0d    0.000000] user:
// [mem ...]  device reserved"); "" when |text| holds no such time. The
// time, not the last "] ", marks the glue: the kernel's own text has "] ".
inline std::string AfterGluedPrefix(const std::string& text) {
  size_t found = std::string::npos;
  for (size_t dot = text.find('.'); dot != std::string::npos; dot = text.find('.', dot + 1)) {
    if (dot == 0 || !std::isdigit(static_cast<unsigned char>(text[dot - 1]))) continue;
    if (text.size() < dot + 9 || text.compare(dot + 7, 2, "] ") != 0) continue;
    if (!std::all_of(text.begin() + static_cast<std::ptrdiff_t>(dot) + 1,
                     text.begin() + static_cast<std::ptrdiff_t>(dot) + 7,
                     [](unsigned char c) { return std::isdigit(c); }))
      continue;
    found = dot + 9;
  }
  return found == std::string::npos ? "" : text.substr(found);
}

// What may stand between the two pieces of a line the UART lost a stretch
// of: up to 2 characters of anything, or what is left of the lost stretch's
// last printk stamp (CI, 2026-12-05: "...]  device  000] user: [mem ...",
// where " reserved", the newline and "[    0.000" were lost), up to a
// stamp's 15 characters of " .0123456789[]".
inline bool LostStretchJunk(std::string_view junk) {
  if (junk.size() <= 2) return true;
  return junk.size() <= 15 && junk.find_first_not_of(" .0123456789[]") == std::string_view::npos;
}

// The log line where a stretch the UART lost ends: |text| is the start of
// log[i] (i within 8 of |next|, at least 8 characters) followed by the end
// of log[j] (j >= i, at least 16 characters), with LostStretchJunk between.
// log.size() when no pair makes up |text|.
inline size_t LostStretchEnd(const std::string& text, const std::vector<LogLine>& log,
                             size_t next) {
  auto common_prefix = [](const std::string& a, const std::string& b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
  };
  auto common_suffix = [](const std::string& a, const std::string& b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[a.size() - 1 - n] == b[b.size() - 1 - n]) ++n;
    return n;
  };
  for (size_t i = next; i < std::min(log.size(), next + 8); ++i) {
    const size_t head = common_prefix(text, log[i].text);
    if (head < 8 || head == text.size()) continue;
    for (size_t j = i; j < log.size(); ++j) {
      const size_t tail = common_suffix(text, log[j].text);
      if (tail < 16) continue;
      if (head + tail >= text.size() ||
          LostStretchJunk(std::string_view(text).substr(head, text.size() - head - tail)))
        return j;
    }
  }
  return log.size();
}

// The log line (within 8 of |next|) that a console line of at most 4
// characters is the start of, give or take one edit; log.size() when none.
inline size_t CutShortIn(const LogLine& line, const std::vector<LogLine>& log, size_t next,
                         bool same_time) {
  if (line.text.empty() || line.text.size() > 4) return log.size();
  for (size_t i = next; i < std::min(log.size(), next + 8); ++i) {
    if (same_time && log[i].time != line.time) continue;
    if (log[i].text.size() <= line.text.size()) continue;
    if (EditDistance(line.text, log[i].text.substr(0, line.text.size())) <= 1) return i;
  }
  return log.size();
}

struct ConsoleMatch {
  size_t compared = 0;
  size_t missing = 0;  // each one also an ADD_FAILURE (the first five)
  size_t garbled = 0;
  size_t pieces = 0;     // console lines the log holds as consecutive pieces
  size_t reordered = 0;  // found before the log's position (another CPU's clock)
  size_t excused = 0;    // missing, and the caller's |may_miss| said why
};

// Every line of |printed| in |log|, in order. |same_time|: the log carries
// printk's own timestamps (the printk ring), so a line must match time and
// text. A log from printk:console events differs from the console in two
// ways the kernel causes, both allowed only then: the event fires per
// printk call, so a line printed in pieces (pr_cont, ACPICA's "ACPI: "
// prefix) is several consecutive log lines; and it carries the trace time
// of the CPU that printed, so lines two CPUs printed close together may
// sort the other way (counted in |reordered|, the caller bounds them).
inline ConsoleMatch MatchConsoleInLog(
    const std::vector<LogLine>& printed, const std::vector<LogLine>& log, bool same_time,
    const char* tag, const std::function<bool(const std::string&)>& may_miss = nullptr) {
  ConsoleMatch r;
  std::vector<bool> used(log.size());
  size_t next = 0;
  auto at = [&](size_t i) { return log.begin() + static_cast<std::ptrdiff_t>(i); };
  auto take = [&](size_t first, size_t last) {
    for (size_t i = first; i <= last; ++i) used[i] = true;
    next = std::max(next, last + 1);
  };
  for (const LogLine& line : printed) {
    ++r.compared;
    auto found = std::find_if(at(next), log.end(), [&](const LogLine& l) {
      return l.text == line.text && (!same_time || l.time == line.time);
    });
    if (found != log.end()) {
      const size_t i = static_cast<size_t>(found - log.begin());
      take(i, i);
      continue;
    }
    if (!same_time) {
      // Printed in pieces: consecutive log lines that make up the line.
      bool joined = false;
      for (size_t k = next; k < std::min(log.size(), next + 8) && !joined; ++k) {
        std::string whole;
        for (size_t m = k; m < log.size() && whole.size() < line.text.size(); ++m) {
          if (!line.text.substr(whole.size()).starts_with(log[m].text) || log[m].text.empty())
            break;
          whole += log[m].text;
          if (whole == line.text && m > k) {
            take(k, m);
            joined = true;
            break;
          }
        }
      }
      if (joined) {
        ++r.pieces;
        continue;
      }
      // Sorted before the log's position: an unused line of the same text.
      bool earlier = false;
      for (size_t i = 0; i < next && !earlier; ++i) {
        if (!used[i] && log[i].text == line.text) {
          used[i] = true;
          earlier = true;
        }
      }
      if (earlier) {
        ++r.reordered;
        std::printf("[%s] sorted earlier in the log: %s\n", tag, line.text.c_str());
        continue;
      }
    }
    // Garbled by the UART: the same time within a few edits, or (no time to
    // go by) one of the log's next lines within a few edits.
    const auto window = same_time ? log.end() : std::min(log.end(), at(next) + 8);
    found = std::find_if(at(next), window, [&](const LogLine& l) {
      return (!same_time || l.time == line.time) &&
             EditDistance(l.text, line.text) <= std::max<size_t>(12, l.text.size() / 4);
    });
    // The prefix itself garbled ("[     .000000]"): the next line with this text.
    if (found == window && same_time) {
      found =
          std::find_if(at(next), log.end(), [&](const LogLine& l) { return l.text == line.text; });
    }
    if (found != window && found != log.end()) {
      ++r.garbled;
      std::printf("[%s] garbled on the console: %s\n   in the log: %s\n", tag, line.text.c_str(),
                  found->text.c_str());
      const size_t i = static_cast<size_t>(found - log.begin());
      take(i, i);
      continue;
    }
    // Garbled and printed in pieces (show_regs' "RSP: ..." then its
    // " ORIG_RAX: ..." piece): a few consecutive log lines within a few edits.
    if (!same_time) {
      bool joined = false;
      const size_t limit = std::max<size_t>(12, line.text.size() / 4);
      for (size_t k = next; k < std::min(log.size(), next + 8) && !joined; ++k) {
        std::string whole;
        for (size_t m = k; m < std::min(log.size(), k + 6); ++m) {
          whole += log[m].text;
          if (m > k && EditDistance(whole, line.text) <= limit) {
            std::printf("[%s] garbled on the console, in pieces in the log: %s\n", tag,
                        line.text.c_str());
            take(k, m);
            joined = true;
            break;
          }
          if (whole.size() > line.text.size() + limit) break;
        }
      }
      if (joined) {
        ++r.garbled;
        continue;
      }
    }
    // Two lines run together (a newline and the next prefix lost): both are
    // in the log; only the glued line is not.
    const std::string rest = AfterGluedPrefix(line.text);
    if (!rest.empty() &&
        std::any_of(at(next), log.end(), [&](const LogLine& l) { return l.text == rest; })) {
      ++r.garbled;
      std::printf("[%s] lines run together on the console: %s\n", tag, line.text.c_str());
      continue;
    }
    // A stretch of output lost (the 8250's hand-over from the boot console,
    // CI 2026-12-04: "clocksource:  les: 0xffffffff, max_idle_ns:
    // 7645041785100000 ns", the start of refined-jiffies' line and the end of
    // jiffies' line 30-odd lines on): the start of one of the log's next
    // lines and the end of the same or a later one make up the whole line.
    if (const size_t j = LostStretchEnd(line.text, log, next); j != log.size()) {
      ++r.garbled;
      std::printf("[%s] output lost inside the console line: %s\n   ends as in the log: %s\n", tag,
                  line.text.c_str(), log[j].text.c_str());
      take(j, j);
      continue;
    }
    // Cut short (CI, 2026-12-05, 7.3 at the 8250's hand-over: "pp" where
    // "printk: console [ttyS0] enabled" stood): a remnant of a few
    // characters, within one edit of the start of one of the log's next
    // lines. Too short to say more; it does not move the log's position.
    if (const auto cut = CutShortIn(line, log, next, same_time); cut != log.size()) {
      ++r.garbled;
      std::printf("[%s] cut short on the console: %s\n   in the log: %s\n", tag, line.text.c_str(),
                  log[cut].text.c_str());
      continue;
    }
    if (may_miss && may_miss(line.text)) {
      ++r.excused;
      std::printf("[%s] not in the log, as the caller allows: %s\n", tag, line.text.c_str());
      continue;
    }
    if (r.missing++ < 5)
      ADD_FAILURE() << "console line not in the capture's log (in order): [" << line.time << "] "
                    << line.text;
  }
  return r;
}

// Where the console starts to be compared with a log that begins partway
// through the boot (a boot range's first console event): the console line
// of the log's first line. The UART garbles lines while the 8250 is set up
// and replays the ring (CI, 2026-12-02: the first line, "NR_IRQS: ...", was
// not on the console verbatim in two runs), so a line within a few edits
// counts, and failing that the log's second or third line; console lines
// before the anchor are not compared. printed.end() when none is there.
inline std::vector<LogLine>::const_iterator ConsoleAnchor(const std::vector<LogLine>& printed,
                                                          const std::vector<LogLine>& log,
                                                          const char* tag) {
  for (size_t k = 0; k < std::min<size_t>(3, log.size()); ++k) {
    const std::string& text = log[k].text;
    auto it = std::find_if(printed.begin(), printed.end(),
                           [&](const LogLine& l) { return l.text == text; });
    if (it == printed.end()) {
      const size_t limit = std::max<size_t>(4, text.size() / 8);
      it = std::find_if(printed.begin(), printed.end(),
                        [&](const LogLine& l) { return EditDistance(l.text, text) <= limit; });
    }
    if (it == printed.end()) continue;
    if (k > 0 || it->text != text)
      std::printf("[%s] console compared from the log's line %zu: %s\n   on the console: %s\n", tag,
                  k + 1, text.c_str(), it->text.c_str());
    return it;
  }
  return printed.end();
}

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_CONSOLE_MATCH_H_
