#include "meta_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <set>

#include "capped_file.h"
#include "durable_file.h"
#include "host_time.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"
#include "meta_bundle_diff.h"
#include "sha256.h"
#include "state_dir.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxIndexBytes = 1u << 20;

bool IsHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Text a guest sent, short and printable for a message.
std::string Quote(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return "'" + out + "'";
}

struct Identity {
  std::string boot_id, release, proc_version, build_id, agent_version;
  uint32_t nr_cpus = 0, page_size = 0;
};

Result<Identity> ParseIdentity(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error{"identity.json is not a JSON object"};
  Identity id;
  const auto str = [&](const char* key, std::string* into, size_t cap, bool required) -> Status {
    auto it = j.find(key);
    if (it == j.end()) {
      if (required) return Error{std::string("identity.json has no ") + key};
      return {};
    }
    if (!it->is_string()) return Error{std::string("identity.json: ") + key + " is not a string"};
    *into = it->get<std::string>();
    if (into->size() > cap) return Error{std::string("identity.json: ") + key + " is too long"};
    return {};
  };
  for (Status s : {str("boot_id", &id.boot_id, 64, true), str("release", &id.release, 256, true),
                   str("build_id", &id.build_id, 128, true),
                   str("proc_version", &id.proc_version, 4096, false),
                   str("agent_version", &id.agent_version, 64, false)}) {
    if (!s.ok()) return s.error();
  }
  const auto num = [&](const char* key, uint32_t* into, uint32_t max) -> Status {
    auto it = j.find(key);
    if (it == j.end()) return {};
    if (!it->is_number_unsigned() || it->get<uint64_t>() == 0 || it->get<uint64_t>() > max) {
      return Error{std::string("identity.json: ") + key + " is not a number in 1.." +
                   std::to_string(max)};
    }
    *into = it->get<uint32_t>();
    return {};
  };
  if (Status s = num("nr_cpus", &id.nr_cpus, 8192); !s.ok()) return s.error();
  if (Status s = num("page_size", &id.page_size, 1u << 20); !s.ok()) return s.error();
  return id;
}

// Checks every fingerprints line against the bundle's formats (see
// ValidateMetaBoot); returns the number of events checked. A line that
// lies (a wrong id or fingerprint, an event with no format) refuses the
// boot. A format with no line is only unverified: an agent older than this
// daemon did not parse it (7.3's vmscan print fmts before 2026-11-29), so
// that one format is set aside as unparsed and the boot's other events
// still decode; the same for a line whose format this daemon cannot parse.
Result<size_t> CheckFingerprints(std::string_view text, HarvestBundle& bundle) {
  std::map<std::string, HarvestedEvent*, std::less<>> events;
  for (HarvestedEvent& ev : bundle.events) events[ev.system + "/" + ev.name] = &ev;
  std::set<std::string, std::less<>> seen;
  size_t line_no = 0, checked = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    if (line.empty()) continue;
    const std::string where = "fingerprints line " + std::to_string(line_no);
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos) return Error{where + " is not '<system>/<event> <id> <fp>'"};
    const std::string_view name = line.substr(0, sp1);
    const std::string_view id_text = line.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string_view fp_text = line.substr(sp2 + 1);
    uint32_t id = 0;
    uint64_t fp = 0;
    if (std::from_chars(id_text.data(), id_text.data() + id_text.size(), id).ec != std::errc() ||
        fp_text.size() != 16 || !IsHex(fp_text) ||
        std::from_chars(fp_text.data(), fp_text.data() + fp_text.size(), fp, 16).ec !=
            std::errc()) {
      return Error{where + " (" + Quote(name) + ") has a malformed id or fingerprint"};
    }
    auto it = events.find(name);
    if (it == events.end()) {
      return Error{"fingerprints name " + Quote(name) + ", which has no format in the archive"};
    }
    if (!seen.insert(std::string(name)).second) {
      return Error{"fingerprints list " + std::string(name) + " twice"};
    }
    HarvestedEvent& ev = *it->second;
    // A format this daemon cannot parse (an agent newer than it) cannot be
    // checked either: set aside like one with no line, not a lie.
    Result<EventFormat> parsed = ev.parse_error.empty()
                                     ? ParseEventFormat(ev.system, ev.text)
                                     : Result<EventFormat>(Error{ev.parse_error});
    if (!parsed.ok()) {
      ev.parse_error = parsed.error().message;
      continue;
    }
    if (parsed->id != id) {
      return Error{"fingerprint line of " + std::string(name) + " gives id " + std::to_string(id) +
                   ", its format id " + std::to_string(parsed->id)};
    }
    if (EventFingerprint(*parsed) != fp) {
      return Error{"fingerprint of " + std::string(name) + " does not match its format"};
    }
    ++checked;
  }
  for (HarvestedEvent& ev : bundle.events) {
    if (ev.parse_error.empty() && !seen.contains(ev.system + "/" + ev.name)) {
      ev.parse_error =
          "the agent sent no fingerprint for it (an older agent that could not parse it); "
          "unverified, so not used";
    }
  }
  return checked;
}

json EntryJson(const MetaBootEntry& e) {
  json j = {{"boot_id", e.boot_id},  {"release", e.release},       {"build_id", e.build_id},
            {"key", e.key},          {"received", e.received_utc}, {"received_ns", e.received_ns},
            {"verified", e.verified}};
  if (e.revision > 1) {
    j["revision"] = e.revision;
    j["updated"] = e.updated_utc;
    j["changes"] = e.changes;
  }
  return j;
}

}  // namespace

Result<MetaBoot> ValidateMetaBoot(const meta::BootId& frame_boot_id, std::string_view archive) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(archive.data()),
                                         archive.size());
  std::map<std::string, std::string> extras;
  Result<HarvestBundle> bundle = ParseHarvestArchive(
      bytes, {{"identity.json", kMaxMetaIdentity}, {"fingerprints", kMaxMetaFingerprints}},
      &extras);
  if (!bundle.ok()) return Error{"boot archive: " + bundle.error().message};
  for (const char* member : {"identity.json", "fingerprints"}) {
    if (!extras.contains(member)) {
      return Error{"boot archive: member '" + std::string(member) + "' is missing"};
    }
  }
  Result<Identity> id = ParseIdentity(extras["identity.json"]);
  if (!id.ok()) return id.error();
  const std::string frame_id = meta::BootIdString(frame_boot_id);
  if (id->boot_id != frame_id) {
    return Error{"identity.json boot_id " + Quote(id->boot_id) + " is not the frame's " + frame_id};
  }
  if (id->release != bundle->release) {
    return Error{"identity.json release " + Quote(id->release) + " is not the archive's " +
                 Quote(bundle->release)};
  }
  std::string build_id = id->build_id;
  std::transform(build_id.begin(), build_id.end(), build_id.begin(),
                 [](char c) { return static_cast<char>(c >= 'A' && c <= 'F' ? c + 32 : c); });
  if (build_id.size() < 32 || build_id.size() > 128 || build_id.size() % 2 != 0 ||
      !IsHex(build_id)) {
    return Error{"identity.json build_id " + Quote(id->build_id) +
                 " is not 16..64 bytes of hex (a GNU build id)"};
  }
  if (!bundle->rejected.empty()) {
    return Error{"boot archive: format " + bundle->rejected.front() +
                 (bundle->rejected.size() > 1
                      ? " (and " + std::to_string(bundle->rejected.size() - 1) + " more)"
                      : std::string())};
  }
  if (bundle->kallsyms.size() > kMaxMetaKallsyms) {
    return Error{"kallsyms is " + std::to_string(bundle->kallsyms.size()) +
                 " bytes; the limit is " + std::to_string(kMaxMetaKallsyms)};
  }
  if (bundle->kallsyms_nonzero_addresses == 0) {
    return Error{"kallsyms has no nonzero address (read with kptr_restrict set?)"};
  }
  Result<size_t> checked = CheckFingerprints(extras["fingerprints"], *bundle);
  if (!checked.ok()) return checked.error();

  MetaBoot boot;
  boot.fingerprints = std::move(extras["fingerprints"]);
  boot.boot_id = frame_id;
  boot.release = id->release;
  boot.proc_version = id->proc_version;
  boot.build_id = std::move(build_id);
  boot.agent_version = id->agent_version;
  boot.nr_cpus = id->nr_cpus;
  boot.page_size = id->page_size;
  boot.key = Sha256Hex(bytes);
  boot.identity = std::move(extras["identity.json"]);
  boot.bundle = std::move(*bundle);
  boot.fingerprints_checked = *checked;
  return boot;
}

Result<std::string> FindGnuBuildId(std::span<const std::byte> notes) {
  // Elf64_Nhdr: namesz, descsz, type (u32 each), then name and desc, each
  // padded to 4 bytes. NT_GNU_BUILD_ID = 3, name "GNU\0".
  const auto u32 = [&](size_t at) {
    uint32_t v = 0;
    std::memcpy(&v, notes.data() + at, 4);
    return v;
  };
  size_t at = 0;
  while (at + 12 <= notes.size()) {
    const uint64_t namesz = u32(at), descsz = u32(at + 4), type = u32(at + 8);
    const uint64_t name_at = at + 12, desc_at = name_at + ((namesz + 3) & ~uint64_t{3});
    const uint64_t next = desc_at + ((descsz + 3) & ~uint64_t{3});
    if (next > notes.size() || (namesz == 0 && descsz == 0 && type == 0)) break;
    if (type == 3 && namesz == 4 && std::memcmp(notes.data() + name_at, "GNU", 4) == 0 &&
        descsz >= 16 && descsz <= 64) {
      static constexpr char kHex[] = "0123456789abcdef";
      std::string hex;
      for (uint64_t i = 0; i < descsz; ++i) {
        const auto b = static_cast<uint8_t>(notes[desc_at + i]);
        hex += kHex[b >> 4];
        hex += kHex[b & 15];
      }
      return hex;
    }
    at = next;
  }
  return Error{"no GNU build-id note in " + std::to_string(notes.size()) + " bytes of notes"};
}

Result<std::vector<MetaBootEntry>> MetaStore::List() const {
  std::error_code ec;
  if (!fs::exists(dir_ / "boots.json", ec)) return std::vector<MetaBootEntry>{};
  Result<std::string> text = ReadCappedFile(dir_ / "boots.json", kMaxIndexBytes);
  if (!text.ok()) return text.error();
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("boots") || !j["boots"].is_array()) {
    return Error{(dir_ / "boots.json").string() + " is not a boots index"};
  }
  std::vector<MetaBootEntry> out;
  for (const json& b : j["boots"]) {
    if (!b.is_object()) continue;
    MetaBootEntry e;
    e.boot_id = b.value("boot_id", std::string());
    e.release = b.value("release", std::string());
    e.build_id = b.value("build_id", std::string());
    e.key = b.value("key", std::string());
    e.received_utc = b.value("received", std::string());
    e.received_ns = b.value("received_ns", int64_t{0});
    e.verified = b.value("verified", json::object());
    e.revision = b.value("revision", uint32_t{1});
    e.updated_utc = b.value("updated", std::string());
    e.changes = b.value("changes", json());
    // The index is ours, but a path is built from it: check it as input.
    if (!meta::ParseBootId(e.boot_id) || !IsValidKernelKey(e.key)) {
      return Error{(dir_ / "boots.json").string() + ": bad entry " + Quote(b.dump())};
    }
    out.push_back(std::move(e));
  }
  return out;
}

bool MetaStore::Has(std::string_view boot_id, std::string_view key) const {
  Result<std::vector<MetaBootEntry>> boots = List();
  if (!boots.ok()) return false;
  return std::any_of(boots->begin(), boots->end(),
                     [&](const MetaBootEntry& e) { return e.boot_id == boot_id && e.key == key; });
}

bool MetaStore::HasBoot(std::string_view boot_id) const {
  Result<std::vector<MetaBootEntry>> boots = List();
  return boots.ok() && std::any_of(boots->begin(), boots->end(),
                                   [&](const MetaBootEntry& e) { return e.boot_id == boot_id; });
}

Status MetaStore::WriteIndex(const std::vector<MetaBootEntry>& boots) const {
  json list = json::array();
  for (const MetaBootEntry& e : boots) list.push_back(EntryJson(e));
  return WriteFileDurably(dir_ / "boots.json", json{{"boots", std::move(list)}}.dump(2) + "\n");
}

namespace {

// After an update, the boot keeps its new bundle and the one it replaced: a
// capture that listed the index just before the update may still be loading
// the replaced one (seen: a guest's agent re-published while its panic was
// being captured). Older revisions go, so an agent re-publishing in a loop
// holds two bundles on disk, not one per revision.
void RemoveOlderBundles(const fs::path& boot_dir, const std::string& keep_new,
                        const std::string& keep_replaced) {
  const fs::path formats = FormatCache(boot_dir).EntryDir(keep_new).parent_path();
  std::error_code ec;
  for (fs::directory_iterator it(formats, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == keep_new || name == keep_replaced || !IsValidKernelKey(name)) continue;
    std::error_code rm;
    fs::remove_all(it->path(), rm);
  }
}

}  // namespace

Status MetaStore::StoreBoot(const MetaBoot& boot, const json& verified, int64_t received_ns) {
  if (!meta::ParseBootId(boot.boot_id)) return Error{"bad boot id " + Quote(boot.boot_id)};
  Result<std::vector<MetaBootEntry>> boots = List();
  if (!boots.ok()) return boots.error();
  const fs::path boot_dir = dir_ / boot.boot_id;
  if (Status s = MakeDirs(boot_dir, 0750); !s.ok()) return s;
  json manifest = {{"source", "meta channel"},
                   {"boot_id", boot.boot_id},
                   {"build_id", boot.build_id},
                   {"agent_version", boot.agent_version},
                   {"fingerprints_checked", boot.fingerprints_checked}};
  Result<fs::path> stored = FormatCache(boot_dir).Store(boot.key, boot.bundle, manifest);
  if (!stored.ok()) return stored.error();
  if (Status s = WriteFileDurably(boot_dir / "identity.json", boot.identity); !s.ok()) return s;
  // The fingerprints of the bundle stored before (if any): what the new one changed.
  Result<std::string> before =
      ReadCappedFile(boot_dir / "fingerprints", kMaxMetaFingerprints, /*missing_ok=*/true);
  if (Status s = WriteFileDurably(boot_dir / "fingerprints", boot.fingerprints); !s.ok()) return s;

  MetaBootEntry entry;
  entry.boot_id = boot.boot_id;
  entry.release = boot.release;
  entry.build_id = boot.build_id;
  entry.key = boot.key;
  entry.received_utc = UtcStamp(received_ns);
  entry.received_ns = received_ns;
  entry.verified = verified;
  auto same = std::find_if(boots->begin(), boots->end(),
                           [&](const MetaBootEntry& e) { return e.boot_id == boot.boot_id; });
  std::string replaced_key;
  if (same != boots->end()) {
    // A newer bundle of a boot already here: it keeps its place (the
    // boot-range decode pairs boots by arrival order) and first arrival.
    replaced_key = same->key != boot.key ? same->key : std::string();
    entry.received_utc = same->received_utc;
    entry.received_ns = same->received_ns;
    entry.revision = same->revision + 1;
    entry.updated_utc = UtcStamp(received_ns);
    entry.changes =
        DiffBundleFingerprints(before.ok() ? *before : std::string(), boot.fingerprints);
    *same = std::move(entry);
  } else {
    boots->push_back(std::move(entry));
  }
  std::vector<MetaBootEntry> dropped;
  while (boots->size() > keep_) {
    dropped.push_back(std::move(boots->front()));
    boots->erase(boots->begin());
  }
  if (Status s = WriteIndex(*boots); !s.ok()) return s;
  for (const MetaBootEntry& e : dropped) {
    std::error_code ec;
    fs::remove_all(dir_ / e.boot_id, ec);
  }
  if (!replaced_key.empty()) RemoveOlderBundles(boot_dir, boot.key, replaced_key);
  return {};
}

Status MetaStore::StoreExtra(std::string_view boot_id, const char* name, std::string_view text) {
  Result<std::vector<MetaBootEntry>> boots = List();
  if (!boots.ok()) return boots.error();
  if (std::none_of(boots->begin(), boots->end(),
                   [&](const MetaBootEntry& e) { return e.boot_id == boot_id; })) {
    return Error{std::string(name) + " for boot " + Quote(boot_id) +
                 ", whose boot bundle was not accepted"};
  }
  return WriteFileDurably(dir_ / std::string(boot_id) / name, text);
}

Status MetaStore::StoreComms(std::string_view boot_id, std::string_view text) {
  return StoreExtra(boot_id, "comms", text);
}

Status MetaStore::StoreClock(std::string_view boot_id, std::string_view text) {
  return StoreExtra(boot_id, "clock.json", text);
}

Result<KernelFormats> MetaStore::LoadFormats(const MetaBootEntry& entry) const {
  return FormatCache(dir_ / entry.boot_id).Load(entry.key);
}

Result<std::string> MetaStore::LoadComms(const MetaBootEntry& entry) const {
  return ReadCappedFile(dir_ / entry.boot_id / "comms", meta::kMaxCommsRaw, true);
}

}  // namespace hvtrace::hostd
