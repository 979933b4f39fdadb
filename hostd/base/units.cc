#include "units.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace hvtrace::hostd {
namespace {

// Splits "16M" into 16 and "M"; the number is a C integer (strtoull |base|:
// 0 reads 0x hex and 0 octal as the kernel does for sizes; durations are
// decimal, so "010" is ten).
Result<std::pair<uint64_t, std::string>> SplitNumber(std::string_view text, const char* what,
                                                     int base = 0) {
  std::string s(text);
  if (s.empty() || s.size() > 24 || s[0] == '-' || s[0] == '+' ||
      std::isspace(static_cast<unsigned char>(s[0]))) {
    return Error{std::string(what) + " '" + s + "' is malformed"};
  }
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, base);
  if (errno == ERANGE) return Error{std::string(what) + " '" + s + "' is too large"};
  if (errno != 0 || end == s.c_str())
    return Error{std::string(what) + " '" + s + "' is not a number"};
  return std::pair<uint64_t, std::string>{static_cast<uint64_t>(v), std::string(end)};
}

Result<uint64_t> Scale(uint64_t v, uint64_t unit, std::string_view text) {
  if (unit != 0 && v > UINT64_MAX / unit)
    return Error{"size '" + std::string(text) + "' overflows"};
  return v * unit;
}

}  // namespace

Result<uint64_t> ParseKernelSize(std::string_view text) {
  auto parts = SplitNumber(text, "size");
  if (!parts.ok()) return parts.error();
  const std::string& suffix = parts->second;
  uint64_t unit = 1;
  if (suffix == "K" || suffix == "k")
    unit = 1ull << 10;
  else if (suffix == "M" || suffix == "m")
    unit = 1ull << 20;
  else if (suffix == "G" || suffix == "g")
    unit = 1ull << 30;
  else if (!suffix.empty())
    return Error{"size '" + std::string(text) + "' has an unknown suffix"};
  return Scale(parts->first, unit, text);
}

Result<uint64_t> ParseSize(std::string_view text, uint64_t bare_unit) {
  auto parts = SplitNumber(text, "size");
  if (!parts.ok()) return parts.error();
  std::string suffix = parts->second;
  if (suffix.empty()) return Scale(parts->first, bare_unit, text);
  for (const char* tail : {"iB", "B"}) {
    const std::string t(tail);
    if (suffix.size() > t.size() && suffix.compare(suffix.size() - t.size(), t.size(), t) == 0) {
      suffix.resize(suffix.size() - t.size());
      break;
    }
  }
  if (suffix == "B") return Scale(parts->first, 1, text);
  static constexpr std::pair<char, int> kShifts[] = {{'K', 10}, {'M', 20}, {'G', 30}, {'T', 40}};
  if (suffix.size() == 1) {
    const char c = static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0])));
    for (auto [letter, shift] : kShifts) {
      if (c == letter) return Scale(parts->first, 1ull << shift, text);
    }
  }
  return Error{"size '" + std::string(text) + "' has an unknown unit '" + parts->second +
               "' (use K, M, G or T, e.g. 16M)"};
}

Result<std::chrono::milliseconds> ParseDuration(std::string_view text,
                                                std::chrono::milliseconds bare_unit) {
  auto parts = SplitNumber(text, "duration", 10);
  if (!parts.ok()) return parts.error();
  const std::string& suffix = parts->second;
  uint64_t unit_ms;
  if (suffix.empty())
    unit_ms = static_cast<uint64_t>(bare_unit.count());
  else if (suffix == "ms")
    unit_ms = 1;
  else if (suffix == "s")
    unit_ms = 1000;
  else if (suffix == "m" || suffix == "min")
    unit_ms = 60'000;
  else if (suffix == "h")
    unit_ms = 3'600'000;
  else
    return Error{"duration '" + std::string(text) + "' has an unknown unit '" + suffix +
                 "' (use ms, s, m or h)"};
  // Anything past a year is a typo, and keeps the product far from overflow.
  constexpr uint64_t kMaxMs = 366ull * 24 * 3'600'000;
  if (unit_ms != 0 && parts->first > kMaxMs / unit_ms) {
    return Error{"duration '" + std::string(text) + "' is too long"};
  }
  return std::chrono::milliseconds(static_cast<int64_t>(parts->first * unit_ms));
}

std::string SizeText(uint64_t bytes) {
  static constexpr std::pair<char, int> kShifts[] = {{'T', 40}, {'G', 30}, {'M', 20}, {'K', 10}};
  if (bytes != 0) {
    for (auto [letter, shift] : kShifts) {
      if (bytes % (1ull << shift) == 0) return std::to_string(bytes >> shift) + letter;
    }
  }
  return std::to_string(bytes);
}

std::string HexText(uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(value));
  return buf;
}

std::string HexId(uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

}  // namespace hvtrace::hostd
