#include "fleet_keys.h"

#include <unistd.h>

#include <cctype>

#include "s3_client.h"

namespace hvtrace::hostd {
namespace {

bool IsComponent(std::string_view s) {
  if (s.empty() || s.size() > 128 || s == "." || s == "..") return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

std::string Join(std::string_view prefix, std::string_view rest) {
  return prefix.empty() ? std::string(rest) : std::string(prefix) + "/" + std::string(rest);
}

}  // namespace

Result<std::string> NormalizePrefix(std::string_view prefix) {
  while (!prefix.empty() && prefix.front() == '/') prefix.remove_prefix(1);
  while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
  if (prefix.empty()) return std::string();
  if (Status ok = ValidateObjectKey(prefix); !ok.ok()) {
    return Error{"upload prefix: " + ok.error().message};
  }
  return std::string(prefix);
}

std::string FleetHostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "unknown-host";
  std::string out(buf);
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  }
  if (out == "." || out == "..") out = "_";
  return out;
}

std::string CaptureKeyPrefix(std::string_view prefix, const FleetCaptureRef& ref) {
  return Join(prefix, ref.host + "/" + ref.vm + "/" + ref.id + "/");
}

std::string IndexListPrefix(std::string_view prefix) { return Join(prefix, "index/"); }

std::string IndexListKey(std::string_view prefix, const FleetCaptureRef& ref) {
  return IndexListPrefix(prefix) + ref.host + "/" + ref.vm + "/" + ref.id + ".json";
}

bool CompressedInStore(std::string_view file) { return file.ends_with(".bin"); }

std::string ObjectNameOf(std::string_view file) {
  return CompressedInStore(file) ? std::string(file) + ".zst" : std::string(file);
}

std::optional<FleetCaptureRef> ParseIndexListKey(std::string_view prefix, std::string_view key) {
  const std::string base = IndexListPrefix(prefix);
  if (!key.starts_with(base) || !key.ends_with(".json")) return std::nullopt;
  key.remove_prefix(base.size());
  key.remove_suffix(5);
  size_t a = key.find('/');
  if (a == std::string_view::npos) return std::nullopt;
  size_t b = key.find('/', a + 1);
  if (b == std::string_view::npos || key.find('/', b + 1) != std::string_view::npos) {
    return std::nullopt;
  }
  FleetCaptureRef ref{std::string(key.substr(0, a)), std::string(key.substr(a + 1, b - a - 1)),
                      std::string(key.substr(b + 1))};
  if (!IsComponent(ref.host) || !IsComponent(ref.vm) || !IsComponent(ref.id)) return std::nullopt;
  return ref;
}

std::optional<CaptureIdParts> ParseCaptureId(std::string_view id) {
  // 20250612T101530.123Z-panic[-2]
  size_t z = id.find("Z-");
  if (z == std::string_view::npos || z < 15) return std::nullopt;
  CaptureIdParts parts{std::string(id.substr(0, z + 1)), std::string(id.substr(z + 2))};
  // A trailing "-N" tells two captures of the same millisecond apart.
  size_t dash = parts.trigger.rfind('-');
  if (dash != std::string::npos && dash + 1 < parts.trigger.size() &&
      parts.trigger.find_first_not_of("0123456789", dash + 1) == std::string::npos) {
    parts.trigger.resize(dash);
  }
  if (parts.trigger.empty()) return std::nullopt;
  return parts;
}

}  // namespace hvtrace::hostd
