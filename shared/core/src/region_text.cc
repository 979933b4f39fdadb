// Text areas of the region: zlib on the guest, a capped, checked inflate on
// the host (the bytes come from an untrusted guest).
#include "hvtrace/region_text.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "zlib_util.h"

namespace hvtrace {
namespace {

constexpr size_t kMaxSymbolName = 512;  // KSYM_NAME_LEN.
constexpr size_t kMaxModuleName = 64;   // MODULE_NAME_LEN - 8 + slack.
constexpr size_t kMaxComm = 64;         // TASK_COMM_LEN is 16; some kernels name more.

// Bytes of text every RegionTextCache of the process holds (kMaxTextHeld).
std::atomic<uint64_t> g_text_held{0};

bool IsHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
bool IsNameChar(char c) { return c > 0x20 && c < 0x7f; }

// "ffffffff81000000 T name" or "... t name\t[module]".
bool SymbolLineOk(std::string_view line, std::string* why) {
  size_t i = 0;
  while (i < line.size() && IsHex(line[i])) ++i;
  if (i == 0 || i > 16) return *why = "address is not 1-16 lower-case hex digits", false;
  if (line.size() < i + 4 || line[i] != ' ' || (line[i + 1] != 'T' && line[i + 1] != 't') ||
      line[i + 2] != ' ') {
    return *why = "not '<address> T|t <name>'", false;
  }
  std::string_view rest = line.substr(i + 3);
  const size_t tab = rest.find('\t');
  const std::string_view name = rest.substr(0, tab);
  if (name.empty() || name.size() > kMaxSymbolName ||
      !std::all_of(name.begin(), name.end(), IsNameChar)) {
    return *why = "symbol name empty, too long or not printable", false;
  }
  if (tab == std::string_view::npos) return true;
  const std::string_view mod = rest.substr(tab + 1);
  if (mod.size() < 3 || mod.size() > kMaxModuleName + 2 || mod.front() != '[' ||
      mod.back() != ']' || !std::all_of(mod.begin() + 1, mod.end() - 1, [](char c) {
        return IsNameChar(c) && c != '[' && c != ']';
      })) {
    return *why = "module is not '[name]'", false;
  }
  return true;
}

// "1234 bash"; comms may hold spaces.
bool CommLineOk(std::string_view line, std::string* why) {
  size_t i = 0;
  while (i < line.size() && line[i] >= '0' && line[i] <= '9') ++i;
  if (i == 0 || i > 10) return *why = "pid is not 1-10 digits", false;
  if (i == line.size() || line[i] != ' ') return *why = "no space after the pid", false;
  const std::string_view comm = line.substr(i + 1);
  if (comm.empty() || comm.size() > kMaxComm ||
      !std::all_of(comm.begin(), comm.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) {
    return *why = "comm empty, longer than 64 or not printable", false;
  }
  return true;
}

RegionIssue BadIssue(TextAreaKind kind) {
  return kind == TextAreaKind::kSymbols ? RegionIssue::kSymbolsBad : RegionIssue::kCommsBad;
}
const char* AreaName(TextAreaKind kind) {
  return kind == TextAreaKind::kSymbols ? "symbol area" : "comm area";
}

}  // namespace

EncodedText EncodeText(std::string_view text) {
  EncodedText e;
  e.raw_size = static_cast<uint32_t>(text.size());
  e.crc32 = zlib_util::Crc32(text);
  e.lines = static_cast<uint64_t>(std::count(text.begin(), text.end(), '\n'));
  // Level 6: ~15% larger than 9 on kallsyms at a third of the time, which
  // counts in a TCG guest. Empty only on out of memory: "no text".
  e.stored = zlib_util::Deflate(text, 6);
  return e;
}

std::string TextSymbolsOf(std::string_view kallsyms, bool* any_address) {
  std::string out;
  *any_address = false;
  while (!kallsyms.empty()) {
    const size_t nl = kallsyms.find('\n');
    const std::string_view line = kallsyms.substr(0, nl);
    kallsyms.remove_prefix(nl == std::string_view::npos ? kallsyms.size() : nl + 1);
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.size() < space + 4) continue;
    const char type = line[space + 1];
    if (type != 'T' && type != 't') continue;
    // The padding before each function (__pfx_, and __cfi_ with kCFI) names
    // no code an event points at, and is half the lines: 7.3's 150k text
    // symbols compressed to 1.06 MiB and did not fit the 1 MiB symbol area
    // (AttachE2e/Linux7_3), without them they do.
    const std::string_view name = line.substr(space + 3);
    if (name.starts_with("__pfx_") || name.starts_with("__cfi_")) continue;
    if (!*any_address && line.substr(0, space).find_first_not_of('0') != std::string_view::npos)
      *any_address = true;
    out.append(line);
    out.push_back('\n');
  }
  return out;
}

Status CheckAreaText(TextAreaKind kind, std::string_view text) {
  if (!text.empty() && text.back() != '\n') return Error{"text does not end with a newline"};
  uint64_t number = 0;
  std::string why;
  while (!text.empty()) {
    ++number;
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    const bool ok =
        kind == TextAreaKind::kSymbols ? SymbolLineOk(line, &why) : CommLineOk(line, &why);
    if (!ok) {
      std::string shown(line.substr(0, 40));
      for (char& c : shown) {
        if (c < 0x20 || c >= 0x7f) c = '?';
      }
      return Error{"line " + std::to_string(number) + " ('" + shown + "'): " + why};
    }
  }
  return Status();
}

Result<std::string> DecodeTextArea(TextAreaKind kind, const RegionTextArea& area) {
  const uint32_t cap = kind == TextAreaKind::kSymbols ? kMaxSymbolText : kMaxCommText;
  if (area.encoding != region::kTextZlib)
    return Error{"encoding " + std::to_string(area.encoding) + " unknown"};
  if (area.raw_size > cap) {
    return Error{"states " + std::to_string(area.raw_size) + " bytes of text, more than the " +
                 std::to_string(cap) + " accepted"};
  }
  Result<std::string> inflated = zlib_util::InflateExact(area.stored, area.raw_size);
  if (!inflated.ok()) return inflated.error();
  std::string text = std::move(*inflated);
  if (zlib_util::Crc32(text) != area.crc32)
    return Error{"CRC of the text does not match the stated one"};
  if (Status s = CheckAreaText(kind, text); !s.ok()) return s.error();
  return text;
}

std::vector<std::string> RegionTextCache::Update(RegionSnapshot* s) {
  std::vector<std::string> notes;
  for (TextAreaKind kind : {TextAreaKind::kSymbols, TextAreaKind::kComms}) {
    PerKind& k = kinds_[kind == TextAreaKind::kSymbols ? 0 : 1];
    const RegionTextArea& area = kind == TextAreaKind::kSymbols ? s->symbols : s->comms;
    if (!area.present) continue;  // Torn or absent: keep what we had.
    const Key key{area.seq, area.boot_generation, area.raw_size, area.crc32, area.stored.size()};
    if (k.looked && key == k.last) continue;
    // Inflating up to kMaxSymbolText costs a live reader ~0.1 s: a guest
    // that rewrites its symbol area on every look must not make it do that
    // every time. A boot's kernel symbols do not change, so the first good
    // ones are kept; after a refused area the next look waits.
    if (kind == TextAreaKind::kSymbols) {
      if (k.by_generation.contains(area.boot_generation)) continue;
      if (k.backoff > 0) {
        --k.backoff;
        continue;
      }
    }
    k.looked = true;
    k.last = key;
    // Refused before inflating: the inflate itself allocates the stated size.
    const uint64_t held = g_text_held.load();
    if (held + area.raw_size > kMaxTextHeld) {
      if (kind == TextAreaKind::kSymbols) k.backoff = kSymbolRetryLooks;
      notes.push_back(std::string(AreaName(kind)) + " of generation " +
                      std::to_string(area.boot_generation) + ": " + std::to_string(area.raw_size) +
                      " bytes not kept: guest texts already take " + std::to_string(held >> 20) +
                      " MiB of this process (limit " + std::to_string(kMaxTextHeld >> 20) +
                      " MiB); its names are not used");
      continue;
    }
    auto text = DecodeTextArea(kind, area);
    if (!text.ok()) {
      if (kind == TextAreaKind::kSymbols) k.backoff = kSymbolRetryLooks;
      const std::string detail = "generation " + std::to_string(area.boot_generation) + ": " +
                                 text.error().message + "; its names are not used";
      notes.push_back(std::string(AreaName(kind)) + " at offset " + std::to_string(area.offset) +
                      ": " + detail);
      s->Report(BadIssue(kind), AreaName(kind), area.offset, detail);
      continue;
    }
    if (kind == TextAreaKind::kSymbols) {
      notes.push_back("guest kernel symbols of generation " + std::to_string(area.boot_generation) +
                      ": " + std::to_string(std::count(text->begin(), text->end(), '\n')) + " (" +
                      std::to_string(text->size()) + " bytes)");
      // The next generation's symbols wait too: a guest that raises its
      // generation on every look gets one inflate per pause, not per look.
      k.backoff = kSymbolRetryLooks;
    }
    Keep(k, area.boot_generation, std::move(*text));
  }
  return notes;
}

void RegionTextCache::Keep(PerKind& k, uint64_t generation, std::string text) {
  g_text_held += text.size();
  auto it = k.by_generation.find(generation);
  if (it != k.by_generation.end()) {
    g_text_held -= it->second.size();
    it->second = std::move(text);
    k.order.erase(std::find(k.order.begin(), k.order.end(), generation));
  } else {
    k.by_generation.emplace(generation, std::move(text));
  }
  k.order.push_back(generation);
  while (k.order.size() > kTextGenerationsKept) {
    auto old = k.by_generation.find(k.order.front());
    g_text_held -= old->second.size();
    k.by_generation.erase(old);
    k.order.erase(k.order.begin());
  }
}

RegionTextCache::~RegionTextCache() { g_text_held -= held_bytes(); }

size_t RegionTextCache::generations_kept(TextAreaKind kind) const {
  return kinds_[kind == TextAreaKind::kSymbols ? 0 : 1].by_generation.size();
}

uint64_t RegionTextCache::held_bytes() const {
  uint64_t n = 0;
  for (const PerKind& k : kinds_) {
    for (const auto& [generation, text] : k.by_generation) n += text.size();
  }
  return n;
}

uint64_t RegionTextCache::process_held_bytes() { return g_text_held.load(); }

const std::string& RegionTextCache::Text(TextAreaKind kind, uint64_t generation) const {
  static const std::string kNone;
  const PerKind& k = kinds_[kind == TextAreaKind::kSymbols ? 0 : 1];
  auto it = k.by_generation.find(generation);
  return it == k.by_generation.end() ? kNone : it->second;
}

}  // namespace hvtrace
