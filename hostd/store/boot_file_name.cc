#include "boot_file_name.h"

#include <algorithm>

namespace hvtrace::hostd {

namespace {
constexpr std::string_view kPrefix = "boot-";
}  // namespace

std::string BootFileName(uint32_t boot, std::string_view suffix) {
  return std::string(kPrefix) + std::to_string(boot) + std::string(suffix);
}

std::optional<uint32_t> BootOfFileName(std::string_view name, std::string_view suffix) {
  if (!name.starts_with(kPrefix) || !name.ends_with(suffix)) return std::nullopt;
  if (name.size() < kPrefix.size() + suffix.size()) return std::nullopt;
  const std::string_view digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 6 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return static_cast<uint32_t>(std::stoul(std::string(digits)));
}

}  // namespace hvtrace::hostd
