#include "formats_bundle.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "hvtrace/format.h"

namespace hvtrace::hostd {
namespace {

constexpr size_t kBlock = 512;

// ustar header field offsets and sizes (POSIX.1-1988).
constexpr size_t kNameOff = 0, kNameLen = 100;
constexpr size_t kSizeOff = 124, kSizeLen = 12;
constexpr size_t kChksumOff = 148, kChksumLen = 8;
constexpr size_t kTypeOff = 156;
constexpr size_t kMagicOff = 257;
constexpr size_t kPrefixOff = 345, kPrefixLen = 155;

std::string Field(const uint8_t* h, size_t off, size_t len) {
  size_t n = 0;
  while (n < len && h[off + n] != 0) ++n;
  return std::string(reinterpret_cast<const char*>(h + off), n);
}

// Plain octal, optionally padded with spaces or NULs. Base-256 (GNU large
// sizes, high bit set) is refused: nothing we harvest needs it.
bool ParseOctal(const uint8_t* h, size_t off, size_t len, uint64_t* out) {
  size_t i = 0;
  while (i < len && h[off + i] == ' ') ++i;
  uint64_t v = 0;
  size_t digits = 0;
  for (; i < len && h[off + i] >= '0' && h[off + i] <= '7'; ++i, ++digits) {
    if (v > (UINT64_MAX >> 3)) return false;
    v = (v << 3) | static_cast<uint64_t>(h[off + i] - '0');
  }
  if (digits == 0) return false;
  for (; i < len; ++i) {
    if (h[off + i] != ' ' && h[off + i] != 0) return false;
  }
  *out = v;
  return true;
}

bool IsZeroBlock(const uint8_t* h) {
  return std::all_of(h, h + kBlock, [](uint8_t b) { return b == 0; });
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == '+' || c == '/';
}

// Normalises a member name, or returns an empty string when it is unsafe.
std::string SafeMemberName(std::string name, bool is_dir) {
  while (name.starts_with("./")) name.erase(0, 2);
  if (is_dir) {
    while (!name.empty() && name.back() == '/') name.pop_back();
    if (name.empty() || name == ".") return ".";  // The archive's root.
  }
  if (name.empty() || name.front() == '/' || name.back() == '/') return {};
  if (!std::all_of(name.begin(), name.end(), IsNameChar)) return {};
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    const std::string_view part(name.data() + start, end - start);
    if (part.empty() || part == "." || part == "..") return {};
    start = end + 1;
  }
  return name;
}

std::string At(size_t offset) { return " (archive offset " + std::to_string(offset) + ")"; }

std::string_view StripNewline(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool IsPrintableLine(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= ' ' && c <= '~'; });
}

}  // namespace

bool IsSafeComponent(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameSize || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return c > ' ' && c <= '~' && c != '/' && c != '\\'; });
}

Result<std::vector<TarMember>> ReadTar(std::span<const std::byte> archive,
                                       const TarLimits& limits) {
  const auto* data = reinterpret_cast<const uint8_t*>(archive.data());
  const size_t size = archive.size();
  std::vector<TarMember> members;
  std::set<std::string> names;
  size_t total = 0;
  size_t off = 0;
  for (;;) {
    if (size - off < kBlock) {
      return Error{"tar archive of " + std::to_string(size) +
                   " bytes ends without its end-of-archive blocks" + At(off) +
                   "; the transfer from the guest was cut short"};
    }
    const uint8_t* h = data + off;
    if (IsZeroBlock(h)) {
      // End of archive. POSIX writes two zero blocks; one is enough to know
      // that every member before it arrived whole (a cut inside a member or
      // its padding fails the size checks below, a cut between members fails
      // the check above).
      break;
    }
    uint64_t want_sum = 0;
    if (!ParseOctal(h, kChksumOff, kChksumLen, &want_sum)) {
      return Error{"tar header with an unreadable checksum" + At(off)};
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < kBlock; ++i) {
      sum += (i >= kChksumOff && i < kChksumOff + kChksumLen) ? uint64_t{' '} : uint64_t{h[i]};
    }
    if (sum != want_sum) {
      return Error{"tar header checksum " + std::to_string(want_sum) + " does not match " +
                   std::to_string(sum) + At(off)};
    }
    if (std::memcmp(h + kMagicOff, "ustar", 5) != 0) {
      return Error{"tar header without the ustar magic" + At(off)};
    }
    std::string raw_name = Field(h, kNameOff, kNameLen);
    const std::string prefix = Field(h, kPrefixOff, kPrefixLen);
    // GNU tar keeps other data where POSIX has the prefix only with its own
    // magic "ustar  "; busybox writes POSIX ustar for short names.
    if (!prefix.empty() && std::memcmp(h + kMagicOff, "ustar\0", 6) == 0) {
      raw_name = prefix + "/" + raw_name;
    }
    const char type = static_cast<char>(h[kTypeOff]);
    uint64_t member_size = 0;
    if (!ParseOctal(h, kSizeOff, kSizeLen, &member_size)) {
      return Error{"tar member '" + raw_name.substr(0, 100) + "' has an unreadable size" + At(off)};
    }
    const bool is_dir = type == '5';
    const bool is_file = type == '0' || type == '\0';
    if (!is_dir && !is_file) {
      return Error{"tar member '" + raw_name.substr(0, 100) + "' has type '" +
                   std::string(1, type >= ' ' && type <= '~' ? type : '?') +
                   "'; only regular files and directories are accepted" + At(off)};
    }
    const std::string name = SafeMemberName(raw_name, is_dir);
    if (name.empty()) {
      return Error{"tar member name '" + raw_name.substr(0, 100) +
                   "' is absolute, has '..' or empty components, or unexpected characters" +
                   At(off)};
    }
    off += kBlock;
    if (is_dir) {
      if (member_size != 0) {
        return Error{"tar directory '" + name + "' claims " + std::to_string(member_size) +
                     " bytes" + At(off - kBlock)};
      }
      continue;
    }
    if (member_size > limits.max_member_bytes) {
      return Error{"tar member '" + name + "' is " + std::to_string(member_size) +
                   " bytes; the limit is " + std::to_string(limits.max_member_bytes) +
                   At(off - kBlock)};
    }
    if (member_size > size - off) {
      return Error{"tar member '" + name + "' claims " + std::to_string(member_size) +
                   " bytes but only " + std::to_string(size - off) + " follow" + At(off - kBlock)};
    }
    total += member_size;
    if (total > limits.max_total_bytes) {
      return Error{"tar members exceed " + std::to_string(limits.max_total_bytes) +
                   " bytes in total at '" + name + "'" + At(off - kBlock)};
    }
    if (members.size() >= limits.max_members) {
      return Error{"tar archive has more than " + std::to_string(limits.max_members) + " members" +
                   At(off - kBlock)};
    }
    if (!names.insert(name).second) {
      return Error{"tar member '" + name + "' appears twice" + At(off - kBlock)};
    }
    members.push_back({name, std::string(reinterpret_cast<const char*>(data + off),
                                         static_cast<size_t>(member_size))});
    const uint64_t padded = (member_size + kBlock - 1) / kBlock * kBlock;
    off += std::min<uint64_t>(padded, size - off);
  }
  return members;
}

Result<std::vector<HarvestedEvent>> SplitFormatListing(std::string_view listing) {
  std::vector<HarvestedEvent> events;
  std::set<std::pair<std::string, std::string>> finished;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos < listing.size()) {
    size_t end = listing.find('\n', pos);
    if (end == std::string_view::npos) end = listing.size();
    const std::string_view line = listing.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    const auto where = [&] { return "format listing line " + std::to_string(line_no); };
    const size_t slash1 = line.find('/');
    if (slash1 == std::string_view::npos) return Error{where() + ": no '<system>/' prefix"};
    const size_t slash2 = line.find('/', slash1 + 1);
    if (slash2 == std::string_view::npos) return Error{where() + ": no '<event>/' prefix"};
    const std::string_view system = line.substr(0, slash1);
    const std::string_view event = line.substr(slash1 + 1, slash2 - slash1 - 1);
    constexpr std::string_view kTail = "format:";
    if (line.substr(slash2 + 1, kTail.size()) != kTail) {
      return Error{where() + ": expected '<system>/<event>/format:'"};
    }
    if (!IsSafeComponent(system) || !IsSafeComponent(event)) {
      return Error{where() + ": unsafe system or event name '" +
                   std::string(line.substr(0, std::min<size_t>(slash2, 128))) + "'"};
    }
    const std::string_view content = line.substr(slash2 + 1 + kTail.size());
    if (events.empty() || events.back().system != system || events.back().name != event) {
      if (!events.empty()) finished.insert({events.back().system, events.back().name});
      if (finished.count({std::string(system), std::string(event)})) {
        return Error{where() + ": lines of " + std::string(system) + "/" + std::string(event) +
                     " are not contiguous"};
      }
      if (events.size() >= kMaxHarvestEvents) {
        return Error{where() + ": more than " + std::to_string(kMaxHarvestEvents) + " events"};
      }
      events.push_back({std::string(system), std::string(event), 0, {}, {}});
    }
    std::string& text = events.back().text;
    if (text.size() + content.size() + 1 > kMaxFormatTextSize) {
      return Error{where() + ": format of " + std::string(system) + "/" + std::string(event) +
                   " exceeds " + std::to_string(kMaxFormatTextSize) + " bytes"};
    }
    text.append(content);
    text.push_back('\n');
  }
  return events;
}

Result<uint64_t> FindKallsym(std::string_view kallsyms, std::string_view name) {
  size_t pos = 0;
  while (pos < kallsyms.size()) {
    size_t end = kallsyms.find('\n', pos);
    if (end == std::string_view::npos) end = kallsyms.size();
    const std::string_view line = kallsyms.substr(pos, end - pos);
    pos = end + 1;
    // "ffffffff81000000 T _stext" or "... t name\t[module]".
    const size_t sp1 = line.find(' ');
    if (sp1 == std::string_view::npos || line.size() < sp1 + 3 || line[sp1 + 2] != ' ') continue;
    std::string_view sym = line.substr(sp1 + 3);
    sym = sym.substr(0, sym.find_first_of(" \t"));
    if (sym != name) continue;
    uint64_t addr = 0;
    const std::string_view hex = line.substr(0, sp1);
    if (hex.empty() || hex.size() > 16)
      return Error{"kallsyms: bad address for " + std::string(name)};
    for (char c : hex) {
      int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
      if (d < 0) return Error{"kallsyms: bad address for " + std::string(name)};
      addr = (addr << 4) | static_cast<uint64_t>(d);
    }
    return addr;
  }
  return Error{"kallsyms has no symbol '" + std::string(name) + "'"};
}

namespace {

// Per-member caps: kallsyms of a distribution kernel with many modules is
// the big one (~7 MiB for Debian's 6.12 with three modules).
const std::map<std::string, size_t>& HarvestMemberCaps() {
  static const std::map<std::string, size_t> kCaps = {{"formats", 32u << 20},
                                                      {"header_page", 64u << 10},
                                                      {"header_event", 64u << 10},
                                                      {"printk_formats", 16u << 20},
                                                      {"kallsyms", 64u << 20},
                                                      {"version", 4096},
                                                      {"release", 256},
                                                      {"modules", 1u << 20}};
  return kCaps;
}

std::string TooBig(const std::string& name, size_t size, size_t cap) {
  return "harvest archive: member '" + name + "' is " + std::to_string(size) +
         " bytes; the limit is " + std::to_string(cap);
}

// Moves each member of |members| into its field of |bundle| (or |formats|,
// |version|, |extras|), checking its cap; a member no list names fails the
// archive, as does a required one that is missing.
Status SortMembers(std::vector<TarMember>& members,
                   const std::map<std::string, size_t>& extra_allowed,
                   std::map<std::string, std::string>* extras, HarvestBundle& bundle,
                   std::string& formats, std::string& version) {
  const std::unordered_map<std::string, std::string*> slot = {
      {"formats", &formats},
      {"header_page", &bundle.header_page},
      {"header_event", &bundle.header_event},
      {"printk_formats", &bundle.printk_formats},
      {"kallsyms", &bundle.kallsyms},
      {"version", &version},
      {"release", &bundle.release},
      {"modules", &bundle.modules}};
  for (TarMember& m : members) {
    if (auto extra = extra_allowed.find(m.name); extra != extra_allowed.end() && extras) {
      if (m.data.size() > extra->second) return Error{TooBig(m.name, m.data.size(), extra->second)};
      (*extras)[m.name] = std::move(m.data);
      continue;
    }
    auto allowed = HarvestMemberCaps().find(m.name);
    if (allowed == HarvestMemberCaps().end()) {
      return Error{"harvest archive: unexpected member '" + m.name + "'"};
    }
    if (m.data.size() > allowed->second) {
      return Error{TooBig(m.name, m.data.size(), allowed->second)};
    }
    *slot.at(m.name) = std::move(m.data);
  }
  for (const char* required : {"formats", "header_page", "header_event", "release", "version",
                               "kallsyms", "printk_formats"}) {
    const bool present = std::any_of(members.begin(), members.end(),
                                     [&](const TarMember& m) { return m.name == required; });
    if (!present)
      return Error{"harvest archive: member '" + std::string(required) + "' is missing"};
  }
  return {};
}

// The kernel's release and /proc/version name the cache entry and are shown
// to users: one line of printable characters each, the release from the
// kernel's own alphabet.
Status CheckIdentity(HarvestBundle& bundle, std::string_view version) {
  const std::string_view release = StripNewline(bundle.release);
  if (release.empty() || release.find('\n') != std::string_view::npos ||
      !std::all_of(release.begin(), release.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == '-' || c == '+' || c == '~';
      })) {
    return Error{"harvest archive: release '" + std::string(release.substr(0, 64)) +
                 "' is not a kernel release string"};
  }
  bundle.release = std::string(release);
  const std::string_view proc_version = StripNewline(version);
  if (proc_version.empty() || !IsPrintableLine(proc_version)) {
    return Error{"harvest archive: /proc/version is empty or not one printable line"};
  }
  bundle.proc_version = std::string(proc_version);
  return {};
}

// Parses each event format of the listing into |bundle|. A format that does
// not parse is kept with its error (its events print raw); one whose name or
// id contradicts the others is rejected, since decoding by it would print
// another event's fields.
Status ParseListedFormats(std::string_view formats, HarvestBundle& bundle) {
  Result<std::vector<HarvestedEvent>> listed = SplitFormatListing(formats);
  if (!listed.ok()) return Error{"harvest archive: " + listed.error().message};
  if (listed->empty()) return Error{"harvest archive: no event formats"};
  std::map<uint32_t, std::string> ids;
  for (HarvestedEvent& ev : *listed) {
    const std::string where = ev.system + "/" + ev.name;
    Result<EventFormat> parsed = ParseEventFormat(ev.system, ev.text);
    if (!parsed.ok()) {
      ev.parse_error = parsed.error().message;
      ++bundle.unparsed;
      bundle.events.push_back(std::move(ev));
      continue;
    }
    if (parsed->name != ev.name) {
      bundle.rejected.push_back(where + ": format names the event '" + parsed->name.substr(0, 64) +
                                "'");
      continue;
    }
    auto [it, fresh] = ids.emplace(parsed->id, where);
    if (!fresh) {
      bundle.rejected.push_back(where + ": id " + std::to_string(parsed->id) + " is also " +
                                it->second + "'s");
      continue;
    }
    ev.id = parsed->id;
    bundle.events.push_back(std::move(ev));
  }
  std::sort(bundle.events.begin(), bundle.events.end(),
            [](const HarvestedEvent& a, const HarvestedEvent& b) {
              return std::tie(a.system, a.name) < std::tie(b.system, b.name);
            });
  return {};
}

// Counts the symbols of kallsyms and those with an address: all zero means
// the guest's kptr_restrict hid them, which the harvest reports.
void CountKallsyms(HarvestBundle& bundle) {
  size_t pos = 0;
  while (pos < bundle.kallsyms.size()) {
    size_t end = bundle.kallsyms.find('\n', pos);
    if (end == std::string::npos) end = bundle.kallsyms.size();
    const std::string_view line(bundle.kallsyms.data() + pos, end - pos);
    pos = end + 1;
    if (line.empty()) continue;
    ++bundle.kallsyms_symbols;
    const std::string_view addr = line.substr(0, line.find(' '));
    if (addr.find_first_not_of('0') != std::string_view::npos) ++bundle.kallsyms_nonzero_addresses;
  }
}

}  // namespace

Result<HarvestBundle> ParseHarvestArchive(std::span<const std::byte> archive) {
  return ParseHarvestArchive(archive, {}, nullptr);
}

Result<HarvestBundle> ParseHarvestArchive(std::span<const std::byte> archive,
                                          const std::map<std::string, size_t>& extra_allowed,
                                          std::map<std::string, std::string>* extras) {
  if (archive.size() > kMaxHarvestArchiveBytes) {
    return Error{"harvest archive is " + std::to_string(archive.size()) + " bytes; the limit is " +
                 std::to_string(kMaxHarvestArchiveBytes)};
  }
  TarLimits limits;
  limits.max_members = 16;
  limits.max_member_bytes = 64u << 20;
  limits.max_total_bytes = kMaxHarvestArchiveBytes;
  Result<std::vector<TarMember>> members = ReadTar(archive, limits);
  if (!members.ok()) return Error{"harvest archive: " + members.error().message};

  HarvestBundle bundle;
  std::string formats, version;
  if (Status s = SortMembers(*members, extra_allowed, extras, bundle, formats, version); !s.ok()) {
    return s.error();
  }
  if (Status s = CheckIdentity(bundle, version); !s.ok()) return s.error();
  if (Result<std::vector<FieldFormat>> hp = ParseHeaderPage(bundle.header_page); !hp.ok()) {
    return Error{"harvest archive: events/header_page: " + hp.error().message};
  }
  if (Result<HeaderEventFormat> he = ParseHeaderEvent(bundle.header_event); !he.ok()) {
    return Error{"harvest archive: events/header_event: " + he.error().message};
  }
  if (Status s = ParseListedFormats(formats, bundle); !s.ok()) return s.error();
  CountKallsyms(bundle);
  return bundle;
}

}  // namespace hvtrace::hostd
