#include "qemu_trace_log.h"

#include <charconv>
#include <limits>

namespace hvtrace::hostd {
namespace {

constexpr size_t kMaxEventName = 128;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

bool IsKey(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s) {
    if (!IsNameChar(c)) return false;
  }
  return true;
}

// Printable ASCII and tabs only: QEMU's format strings print numbers, host
// names and pointers; anything else (a NUL, an escape sequence, bytes that
// are not UTF-8) did not come from them and would reach JSON and terminals.
bool PrintableAscii(std::string_view line) {
  for (char c : line) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u >= 0x7f) return false;
  }
  return true;
}

template <typename T>
bool ParseDigits(std::string_view s, T& out) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

// "vdev 0x55d0 val 3" -> {vdev, 0x55d0}, {val, 3}; anything that is not an
// even run of key/value tokens is one pair with an empty key.
std::vector<std::pair<std::string, std::string>> SplitArgs(std::string_view text) {
  std::vector<std::string_view> tokens;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    const size_t start = i;
    while (i < text.size() && text[i] != ' ' && text[i] != '\t') ++i;
    if (i > start) tokens.push_back(text.substr(start, i - start));
  }
  std::vector<std::pair<std::string, std::string>> args;
  if (tokens.empty()) return args;
  bool pairs = tokens.size() % 2 == 0;
  for (size_t t = 0; pairs && t < tokens.size(); t += 2) pairs = IsKey(tokens[t]);
  if (!pairs) {
    const size_t first = text.find_first_not_of(" \t");
    const size_t last = text.find_last_not_of(" \t");
    args.emplace_back(std::string(), std::string(text.substr(first, last - first + 1)));
    return args;
  }
  for (size_t t = 0; t < tokens.size(); t += 2) {
    args.emplace_back(std::string(tokens[t]), std::string(tokens[t + 1]));
  }
  return args;
}

// One line without its end; an empty string when it parsed, else why not.
std::string ParseLine(std::string_view line, QemuTraceEvent& event) {
  if (line.size() > kQemuTraceMaxLine) {
    return "longer than " + std::to_string(kQemuTraceMaxLine) + " bytes";
  }
  if (!PrintableAscii(line)) return "holds a control or non-ASCII byte";
  const size_t at = line.find('@');
  if (at == std::string_view::npos) return "no TID@ prefix (not a `-msg timestamp=on` trace line)";
  if (!ParseDigits(line.substr(0, at), event.tid)) return "thread id is not a 32-bit number";
  const size_t colon = line.find(':', at + 1);
  if (colon == std::string_view::npos) return "no ':' after the time";
  const std::string_view time = line.substr(at + 1, colon - at - 1);
  const size_t dot = time.find('.');
  uint64_t sec = 0;
  uint32_t usec = 0;
  if (dot == std::string_view::npos || time.size() - dot - 1 != 6 ||
      !ParseDigits(time.substr(0, dot), sec) || !ParseDigits(time.substr(dot + 1), usec)) {
    return "time '" + std::string(time.substr(0, 32)) + "' is not SEC.USEC (6 digits)";
  }
  if (sec > std::numeric_limits<uint64_t>::max() / 1'000'000'000ull - 1) {
    return "time " + std::to_string(sec) + " s does not fit in 64-bit nanoseconds";
  }
  event.realtime_ns = sec * 1'000'000'000ull + uint64_t{usec} * 1000ull;
  std::string_view rest = line.substr(colon + 1);
  size_t name_end = 0;
  while (name_end < rest.size() && IsNameChar(rest[name_end])) ++name_end;
  if (name_end == 0) return "no event name after the time";
  if (name_end > kMaxEventName) return "event name longer than 128 bytes";
  if (name_end < rest.size() && rest[name_end] != ' ' && rest[name_end] != '\t') {
    return "event name is followed by '" + std::string(1, rest[name_end]) + "', not a space";
  }
  event.name = std::string(rest.substr(0, name_end));
  event.args = SplitArgs(rest.substr(name_end));
  return {};
}

}  // namespace

QemuTraceLog ParseQemuTraceLog(std::string_view text) {
  QemuTraceLog log;
  uint64_t line_no = 0;
  size_t pos = 0;
  auto problem = [&](const std::string& why) {
    ++log.malformed_lines;
    if (log.first_problem.empty())
      log.first_problem = "line " + std::to_string(line_no) + ": " + why;
  };
  while (pos < text.size()) {
    ++line_no;
    const size_t nl = text.find('\n', pos);
    const bool terminated = nl != std::string_view::npos;
    const size_t end = terminated ? nl : text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = terminated ? nl + 1 : text.size();
    if (log.events.size() >= kQemuTraceMaxEvents) {
      ++log.dropped_lines;
      continue;
    }
    // QEMU writes whole lines (its log is line-buffered): a last line
    // without its end was cut while QEMU wrote it, and its last value may be
    // cut too ("val 1" of "val 15").
    if (!terminated) {
      problem("no line end (cut short while QEMU wrote it)");
      continue;
    }
    QemuTraceEvent event;
    if (std::string why = ParseLine(line, event); !why.empty()) {
      problem(why);
      continue;
    }
    log.events.push_back(std::move(event));
  }
  if (log.dropped_lines != 0 && log.first_problem.empty()) {
    log.first_problem = "lines after event " + std::to_string(kQemuTraceMaxEvents) + " dropped (" +
                        std::to_string(log.dropped_lines) + ")";
  }
  return log;
}

}  // namespace hvtrace::hostd
