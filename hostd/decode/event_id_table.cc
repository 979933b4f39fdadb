#include "event_id_table.h"

#include <map>

#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"

namespace hvtrace::hostd {

using nlohmann::json;

EventIdentities IdentitiesOf(const KernelFormats& formats, uint64_t* unparsed) {
  EventIdentities out;
  for (const CachedEventFormat& ev : formats.events) {
    Result<EventFormat> f = ev.parse_error.empty() ? ParseEventFormat(ev.system, ev.text)
                                                   : Result<EventFormat>(Error{ev.parse_error});
    if (!f.ok()) {
      if (unparsed != nullptr) ++*unparsed;
      continue;
    }
    out[ev.system + "/" + ev.name] = {ev.id, EventFingerprint(*f)};
  }
  return out;
}

json CompareEventIds(const EventIdentities& before, const EventIdentities& after,
                     size_t max_listed) {
  json moved = json::array(), changed = json::array(), vanished = json::array(),
       added = json::array();
  uint64_t kept = 0, n_moved = 0, n_changed = 0, n_vanished = 0, n_new = 0;
  auto list = [&](json& l, json entry) {
    if (l.size() < max_listed) l.push_back(std::move(entry));
  };
  for (const auto& [name, a] : after) {
    auto b = before.find(name);
    if (b == before.end()) {
      ++n_new;
      list(added, {{"event", name}, {"id", a.id}});
    } else if (b->second.fingerprint != a.fingerprint) {
      ++n_changed;
      list(changed, {{"event", name}, {"id_before", b->second.id}, {"id", a.id}});
    } else if (b->second.id != a.id) {
      ++n_moved;
      list(moved, {{"event", name}, {"from", b->second.id}, {"to", a.id}});
    } else {
      ++kept;
    }
  }
  for (const auto& [name, b] : before) {
    if (!after.contains(name)) {
      ++n_vanished;
      list(vanished, {{"event", name}, {"id_before", b.id}});
    }
  }
  json j = {{"counts",
             {{"kept", kept},
              {"moved", n_moved},
              {"changed", n_changed},
              {"vanished", n_vanished},
              {"new", n_new}}}};
  if (n_moved) j["moved"] = std::move(moved);
  if (n_changed) j["changed"] = std::move(changed);
  if (n_vanished) j["vanished"] = std::move(vanished);
  if (n_new) j["new"] = std::move(added);
  return j;
}

json EventsAcrossBoots(std::span<const KernelFormats* const> per_boot) {
  json boots = json::array();
  std::map<const KernelFormats*, EventIdentities> ids;
  auto identities = [&](const KernelFormats* f) -> const EventIdentities& {
    auto it = ids.find(f);
    if (it == ids.end()) it = ids.emplace(f, IdentitiesOf(*f)).first;
    return it->second;
  };
  for (size_t b = 1; b < per_boot.size(); ++b) {
    json entry = {{"boot", b}, {"compared_with", b - 1}};
    const KernelFormats* prev = per_boot[b - 1];
    const KernelFormats* cur = per_boot[b];
    if (prev == nullptr || cur == nullptr) {
      entry["note"] = "not compared: a boot has no formats";
    } else if (prev == cur) {
      entry["same_formats"] = true;
      entry["counts"] = {{"kept", identities(cur).size()},
                         {"moved", 0},
                         {"changed", 0},
                         {"vanished", 0},
                         {"new", 0}};
    } else {
      entry.update(CompareEventIds(identities(prev), identities(cur)));
    }
    boots.push_back(std::move(entry));
  }
  return json{{"boots", std::move(boots)}};
}

json EventsAcrossBoots(std::span<const EventIdentities> per_boot,
                       std::span<const uint64_t> boot_numbers) {
  json boots = json::array();
  for (size_t b = 1; b < per_boot.size(); ++b) {
    json entry = {{"generation", b < boot_numbers.size() ? boot_numbers[b] : b},
                  {"compared_with", b - 1 < boot_numbers.size() ? boot_numbers[b - 1] : b - 1}};
    entry.update(CompareEventIds(per_boot[b - 1], per_boot[b]));
    boots.push_back(std::move(entry));
  }
  return json{{"generations", std::move(boots)}};
}

json EventsAcrossGenerations(const RegionSnapshot& snapshot) {
  std::map<uint32_t, EventIdentities> by_generation;
  for (const RegionFormat& f : snapshot.formats) {
    if (f.kind != region::kFormatKernelEvent && f.kind != region::kFormatDwEvent) continue;
    if (!f.parsed) continue;
    by_generation[f.boot_generation][f.system + "/" + f.parsed->name] = {f.id, f.fingerprint};
  }
  std::vector<EventIdentities> tables;
  std::vector<uint64_t> numbers;
  for (auto& [gen, ids] : by_generation) {
    numbers.push_back(gen);
    tables.push_back(std::move(ids));
  }
  json j = EventsAcrossBoots(tables, numbers);
  j["tables"] = numbers;
  return j;
}

}  // namespace hvtrace::hostd
