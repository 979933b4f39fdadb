// kBoot bundles (hvtrace/meta_channel.h) made from the real boot_map
// fixtures, as the guest agent sends them: the harvest members plus
// identity.json and fingerprints. Tests edit the members to make them lie.
#ifndef HVTRACE_TESTS_UNIT_META_FIXTURE_H_
#define HVTRACE_TESTS_UNIT_META_FIXTURE_H_

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"
#include "hvtrace/meta_channel.h"
#include "test_support.h"

namespace hvtrace::test_support {

inline const std::filesystem::path kMetaFixtures =
    std::filesystem::path(HVTRACE_FIXTURES_DIR) / "boot_map";
inline constexpr char kFixtureBuildId[] = "0123456789abcdef0123456789abcdef01234567";

// A plain ustar archive of |members| (name → data), in name order.
inline std::string UstarArchive(const std::map<std::string, std::string>& members) {
  std::string out;
  for (const auto& [name, data] : members) {
    std::string h(512, '\0');
    h.replace(0, name.size(), name);
    const auto put = [&](size_t off, const std::string& v) { h.replace(off, v.size(), v); };
    put(100, "0000644");
    put(108, "0000000");
    put(116, "0000000");
    char size[16];
    std::snprintf(size, sizeof size, "%011llo", static_cast<unsigned long long>(data.size()));
    put(124, size);
    put(136, "00000000000");
    h[156] = '0';
    put(257, "ustar");
    put(263, "00");
    std::memset(&h[148], ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    char chk[8];
    std::snprintf(chk, sizeof chk, "%06o", sum);
    std::memcpy(&h[148], chk, 7);
    out += h + data;
    out.append((512 - data.size() % 512) % 512, '\0');
  }
  return out + std::string(1024, '\0');
}

// The members of a kBoot bundle for the fixture kernel in |dir| (a
// boot_map fixture directory) sent by boot |boot_id|.
inline std::map<std::string, std::string> MetaBootMembers(const std::filesystem::path& dir,
                                                          const meta::BootId& boot_id) {
  std::map<std::string, std::string> m;
  std::vector<std::filesystem::path> formats;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir / "formats")) {
    if (e.path().filename() == "format") formats.push_back(e.path());
  }
  std::sort(formats.begin(), formats.end());
  std::string listing, fingerprints;
  for (const std::filesystem::path& p : formats) {
    const std::string event = p.parent_path().filename().string();
    const std::string system = p.parent_path().parent_path().filename().string();
    const std::string text = ReadText(p.string());
    size_t pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      listing += system + "/" + event + "/format:" + text.substr(pos, nl - pos) + "\n";
      pos = nl + 1;
    }
    Result<EventFormat> parsed = ParseEventFormat(system, text);
    if (!parsed.ok()) continue;
    char fp[32];
    std::snprintf(fp, sizeof fp, "%016llx",
                  static_cast<unsigned long long>(EventFingerprint(*parsed)));
    fingerprints += system + "/" + event + " " + std::to_string(parsed->id) + " " + fp + "\n";
  }
  m["formats"] = listing;
  m["fingerprints"] = fingerprints;
  m["header_page"] = ReadText((dir / "header_page").string());
  m["header_event"] = ReadText((dir / "header_event").string());
  m["kallsyms"] = ReadText((dir / "kallsyms").string());
  m["printk_formats"] = "";
  m["release"] = "6.12.95+deb12-amd64\n";
  m["version"] = "Linux version 6.12.95+deb12-amd64 (fixture)\n";
  m["identity.json"] = nlohmann::json{
      {"boot_id", meta::BootIdString(boot_id)},
      {"release", "6.12.95+deb12-amd64"},
      {"proc_version", "Linux version 6.12.95+deb12-amd64"},
      {"build_id", kFixtureBuildId},
      {"nr_cpus", 2},
      {"page_size", 4096},
      {"agent_version",
       "test"}}.dump();
  return m;
}

inline meta::BootId TestBootId(uint8_t n) {
  meta::BootId id{};
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(0x10 * n + i);
  return id;
}

}  // namespace hvtrace::test_support

#endif  // HVTRACE_TESTS_UNIT_META_FIXTURE_H_
