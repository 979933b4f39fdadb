// TepSymbols (see tep_symbols.h).
#include "hvtrace/tep_symbols.h"

#include <traceevent/event-parse.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <system_error>

#include "hvtrace/kallsyms_table.h"

namespace hvtrace {
namespace {

// isspace() in the C locale: where sscanf's %s and ' ' stop.
bool IsSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Whether tep_parse_kallsyms reads |line| (one KallsymsTable symbol:
// "ADDR TYPE " checked) as we do: sscanf(line, "%16llx %c %n%*s%n%*1[\t][%n%*s%n")
// with the name starting right after "TYPE ", running to the first space,
// and followed by nothing or by "\t[MOD]" up to the end of the line.
// Sets |*name_len| and |*mod| (empty for none).
bool ReadsAlike(std::string_view line, const KallsymsTable::Symbol& s, size_t* name_len,
                std::string_view* mod) {
  if (IsSpace(s.type)) return false;  // " %c" would skip it.
  std::string_view rest = line.substr(s.digits + 3u);
  size_t n = 0;
  while (n < rest.size() && !IsSpace(rest[n])) ++n;
  if (n == 0) return false;  // " %n" would skip on to a later word.
  *name_len = n;
  rest.remove_prefix(n);
  *mod = {};
  if (rest.empty()) return true;
  // "\t[" then a word that ends the line; libtraceevent drops its last
  // character, the ']'.
  if (rest.size() < 4 || rest[0] != '\t' || rest[1] != '[' || rest.back() != ']') return false;
  std::string_view word = rest.substr(2);
  for (char c : word) {
    if (IsSpace(c)) return false;
  }
  *mod = word.substr(0, word.size() - 1);
  return true;
}

// Enough symbols to pay for a second thread (~0.1 ms to start and join).
constexpr size_t kSymbolsForAThread = 20000;

}  // namespace

bool TepSymbols::AddEntries(std::string_view kallsyms,
                            std::span<const KallsymsTable::Symbol> symbols) {
  for (const KallsymsTable::Symbol& s : symbols) {
    const std::string_view line = KallsymsTable::Line(kallsyms, s);
    size_t name_len = 0;
    std::string_view mod;
    if (!ReadsAlike(line, s, &name_len, &mod)) return false;
    const std::string_view name = line.substr(s.digits + 3u, name_len);
    // libtraceevent's filter: ARM's '$a' mapping symbols and x86-64's
    // per-CPU offsets (absolute symbols).
    if (name[0] == '$' || s.type == 'A' || s.type == 'a') continue;
    Entry e{s.addr, static_cast<uint32_t>(strings_.size()), UINT32_MAX, s.offset};
    strings_.append(name);
    strings_.push_back('\0');
    if (!mod.empty()) {
      e.mod = static_cast<uint32_t>(strings_.size());
      strings_.append(mod);
      strings_.push_back('\0');
    }
    entries_.push_back(e);
    tags_.push_back(Tag(name));
  }
  return true;
}

std::unique_ptr<TepSymbols> TepSymbols::Build(std::string_view kallsyms) {
  // tep_parse_kallsyms takes a C string: a NUL would end it early.
  if (kallsyms.find('\0') != std::string_view::npos) return nullptr;
  if (kallsyms.size() >= UINT32_MAX / 2) return nullptr;
  // Both halves of the work on two threads: the table was 98 M instructions
  // of `hvtrace report` on bench/large.dat (callgrind) before its first
  // record, all of it on one thread.
  std::shared_ptr<const KallsymsTable> table = KallsymsTable::Parse(kallsyms, 2);
  // strtok_r skips empty lines; any other line KallsymsTable dropped would
  // stop tep_parse_kallsyms (or be read some other way).
  if (table->lines() != table->symbols().size()) return nullptr;

  auto out = std::unique_ptr<TepSymbols>(new TepSymbols());
  const std::span<const KallsymsTable::Symbol> all = table->symbols();
  const size_t half = all.size() >= kSymbolsForAThread ? all.size() / 2 : all.size();
  // Room for both halves in the first one's, which the second's are appended
  // to (the names are less than the text): no copy of a grown buffer.
  out->strings_.reserve(kallsyms.size() + 1);
  out->entries_.reserve(all.size());
  out->tags_.reserve(all.size());
  TepSymbols second;
  std::future<bool> second_ok;
  if (half < all.size()) {
    second.strings_.reserve(kallsyms.size() + 1);
    second.entries_.reserve(all.size() - half);
    second.tags_.reserve(all.size() - half);
    try {
      second_ok = std::async(std::launch::async,
                             [&] { return second.AddEntries(kallsyms, all.subspan(half)); });
    } catch (const std::system_error&) {
      second_ok = {};
    }
  }
  const bool first_ok = out->AddEntries(kallsyms, all.first(second_ok.valid() ? half : all.size()));
  if (second_ok.valid()) {
    if (!second_ok.get() || !first_ok) return nullptr;
    const auto shift = static_cast<uint32_t>(out->strings_.size());
    for (Entry e : second.entries_) {
      e.name += shift;
      if (e.mod != UINT32_MAX) e.mod += shift;
      out->entries_.push_back(e);
    }
    out->strings_.append(second.strings_);
    out->tags_.insert(out->tags_.end(), second.tags_.begin(), second.tags_.end());
  } else if (!first_ok) {
    return nullptr;
  }
  // KallsymsTable keeps file order among equal addresses; libtraceevent's
  // list is reversed before its stable sort.
  std::vector<Entry>& v = out->entries_;
  for (size_t i = 0; i < v.size();) {
    size_t j = i + 1;
    while (j < v.size() && v[j].addr == v[i].addr) ++j;
    std::reverse(v.begin() + static_cast<std::ptrdiff_t>(i),
                 v.begin() + static_cast<std::ptrdiff_t>(j));
    std::reverse(out->tags_.begin() + static_cast<std::ptrdiff_t>(i),
                 out->tags_.begin() + static_cast<std::ptrdiff_t>(j));
    i = j;
  }
  return out;
}

void TepSymbols::Install(tep_handle* tep) const {
  // libtraceevent's priv is not const; Resolve reads through a const pointer.
  tep_set_function_resolver(tep, &Resolve, const_cast<TepSymbols*>(this));
}

char* TepSymbols::Resolve(void* priv, unsigned long long* addrp, char** modp) {
  const auto* self = static_cast<const TepSymbols*>(priv);
  uint64_t start = 0;
  const char* mod = nullptr;
  const char* name = self->Find(*addrp, &start, &mod);
  if (name == nullptr) return nullptr;
  *addrp = start;
  // libtraceevent's interface is not const-correct; it never writes them.
  *modp = const_cast<char*>(mod);
  return const_cast<char*>(name);
}

const char* TepSymbols::Find(uint64_t addr, uint64_t* start, const char** mod) const {
  // Read first: the table is shared by the decoders of a parallel report,
  // and a store on every lookup would bounce the line between their CPUs.
  if (!looked_up_.load(std::memory_order_relaxed))
    looked_up_.store(true, std::memory_order_relaxed);
  // glibc's bsearch with func_bcmp, over func_count entries followed by a
  // sentinel whose address is 0.
  const size_t n = entries_.size();
  size_t l = 0, u = n;
  while (l < u) {
    const size_t idx = (l + u) / 2;
    const uint64_t at = entries_[idx].addr;
    const uint64_t next = idx + 1 < n ? entries_[idx + 1].addr : 0;
    if (addr == at || (addr > at && addr < next)) {
      const Entry& e = entries_[idx];
      *start = e.addr;
      *mod = e.mod == UINT32_MAX ? nullptr : strings_.data() + e.mod;
      return strings_.data() + e.name;
    }
    if (addr < at) {
      u = idx;
    } else {
      l = idx + 1;
    }
  }
  return nullptr;
}

uint8_t TepSymbols::Tag(std::string_view name) {
  uint32_t h = static_cast<uint32_t>(name.size()) * 0x9e3779b1u;
  if (!name.empty()) {
    h ^= static_cast<unsigned char>(name.front()) * 0x85ebca6bu;
    h ^= static_cast<unsigned char>(name.back()) * 0xc2b2ae35u;
  }
  return static_cast<uint8_t>(h >> 24);
}

uint64_t TepSymbols::AtomValue(std::string_view name, bool map_built, bool* certain) const {
  const Entry* first = nullptr;  // In map order.
  const Entry* last_line = nullptr;
  *certain = true;
  if (name.find('\0') != std::string_view::npos) return 0;  // No symbol name has one.
  // Every symbol is a candidate (~200,000): only those whose tag (length,
  // first and last byte) matches are compared, found by memchr over the
  // tags. Reading every entry and name instead was ~3.5 ms of `hvtrace
  // report` on bench/large.dat for its 9 atoms (perf), all memory traffic.
  const char* const strings = strings_.data();
  const uint8_t tag = Tag(name);
  const auto* const tags = tags_.data();
  const size_t n = tags_.size();
  for (size_t i = 0; i < n; ++i) {
    const void* hit = std::memchr(tags + i, tag, n - i);
    if (hit == nullptr) break;
    i = static_cast<size_t>(static_cast<const uint8_t*>(hit) - tags);
    const Entry& e = entries_[i];
    const char* s = strings + e.name;
    if (std::strncmp(s, name.data(), name.size()) != 0 || s[name.size()] != '\0') continue;
    if (first == nullptr) first = &e;
    if (e.addr != first->addr) *certain = false;
    if (last_line == nullptr || e.file_index > last_line->file_index) last_line = &e;
  }
  if (first == nullptr) return 0;
  // Before the map is built, libtraceevent searches its list, which runs in
  // reverse file order: the last line of that name.
  return map_built ? first->addr : last_line->addr;
}

}  // namespace hvtrace
