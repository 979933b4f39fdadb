#include "meta_bundle_diff.h"

#include <charconv>
#include <map>
#include <string>

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

struct IdPrint {
  uint32_t id = 0;
  std::string fingerprint;
};

std::map<std::string, IdPrint, std::less<>> ParseLines(std::string_view text) {
  std::map<std::string, IdPrint, std::less<>> out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos) continue;
    IdPrint p;
    const std::string_view id = line.substr(sp1 + 1, sp2 - sp1 - 1);
    if (std::from_chars(id.data(), id.data() + id.size(), p.id).ec != std::errc()) continue;
    p.fingerprint = std::string(line.substr(sp2 + 1));
    out.emplace(std::string(line.substr(0, sp1)), std::move(p));
  }
  return out;
}

}  // namespace

json DiffBundleFingerprints(std::string_view before, std::string_view after, size_t max_listed) {
  const auto old_events = ParseLines(before);
  const auto new_events = ParseLines(after);
  json out = {{"added", json::array()},
              {"removed", json::array()},
              {"moved", json::array()},
              {"changed", json::array()}};
  size_t kept = 0;
  std::map<std::string, size_t> counts;
  const auto add = [&](const char* key, json item) {
    if (counts[key]++ < max_listed) out[key].push_back(std::move(item));
  };
  for (const auto& [name, now] : new_events) {
    auto it = old_events.find(name);
    if (it == old_events.end()) {
      add("added", name);
    } else if (it->second.fingerprint != now.fingerprint) {
      add("changed", {{"event", name}, {"id", now.id}});
    } else if (it->second.id != now.id) {
      add("moved", {{"event", name}, {"from", it->second.id}, {"to", now.id}});
    } else {
      ++kept;
    }
  }
  for (const auto& [name, was] : old_events) {
    if (!new_events.contains(name)) add("removed", name);
  }
  for (const char* key : {"added", "removed", "moved", "changed"}) {
    out[std::string(key) + "_count"] = counts[key];
  }
  out["kept"] = kept;
  return out;
}

}  // namespace hvtrace::hostd
