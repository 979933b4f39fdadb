// TepSymbols (see tep_symbols.h).
#include "hvtrace/tep_symbols.h"

#include <traceevent/event-parse.h>

#include <algorithm>
#include <cstring>

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

}  // namespace

std::unique_ptr<TepSymbols> TepSymbols::Build(std::string_view kallsyms) {
  // tep_parse_kallsyms takes a C string: a NUL would end it early.
  if (kallsyms.find('\0') != std::string_view::npos) return nullptr;
  if (kallsyms.size() >= UINT32_MAX / 2) return nullptr;
  std::shared_ptr<const KallsymsTable> table = KallsymsTable::Parse(kallsyms);
  // strtok_r skips empty lines; any other line KallsymsTable dropped would
  // stop tep_parse_kallsyms (or be read some other way).
  size_t lines = 0;
  for (size_t pos = 0; pos < kallsyms.size();) {
    size_t nl = kallsyms.find('\n', pos);
    if (nl == std::string_view::npos) nl = kallsyms.size();
    if (nl > pos) ++lines;
    pos = nl + 1;
  }
  if (lines != table->symbols().size()) return nullptr;

  auto out = std::unique_ptr<TepSymbols>(new TepSymbols());
  out->strings_.reserve(kallsyms.size() + 1);
  out->entries_.reserve(table->symbols().size());
  for (const KallsymsTable::Symbol& s : table->symbols()) {
    const std::string_view line = KallsymsTable::Line(kallsyms, s);
    size_t name_len = 0;
    std::string_view mod;
    if (!ReadsAlike(line, s, &name_len, &mod)) return nullptr;
    const std::string_view name = line.substr(s.digits + 3u, name_len);
    // libtraceevent's filter: ARM's '$a' mapping symbols and x86-64's
    // per-CPU offsets (absolute symbols).
    if (name[0] == '$' || s.type == 'A' || s.type == 'a') continue;
    Entry e{s.addr, static_cast<uint32_t>(out->strings_.size()), UINT32_MAX, s.offset};
    out->strings_.append(name);
    out->strings_.push_back('\0');
    if (!mod.empty()) {
      e.mod = static_cast<uint32_t>(out->strings_.size());
      out->strings_.append(mod);
      out->strings_.push_back('\0');
    }
    out->entries_.push_back(e);
  }
  // KallsymsTable keeps file order among equal addresses; libtraceevent's
  // list is reversed before its stable sort.
  std::vector<Entry>& v = out->entries_;
  for (size_t i = 0; i < v.size();) {
    size_t j = i + 1;
    while (j < v.size() && v[j].addr == v[i].addr) ++j;
    std::reverse(v.begin() + static_cast<std::ptrdiff_t>(i),
                 v.begin() + static_cast<std::ptrdiff_t>(j));
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

uint64_t TepSymbols::AtomValue(std::string_view name, bool map_built, bool* certain) const {
  const Entry* first = nullptr;  // In map order.
  const Entry* last_line = nullptr;
  *certain = true;
  if (name.find('\0') != std::string_view::npos) return 0;  // No symbol name has one.
  // Every symbol is scanned (~200,000): the first byte is checked before
  // the whole name, and no strlen is taken per symbol (comparing with a
  // string_view took one: this loop was 27 M instructions of `hvtrace
  // report` on bench/large.dat for its 9 atoms, now 11 M; callgrind).
  const char* const strings = strings_.data();
  for (const Entry& e : entries_) {
    const char* s = strings + e.name;
    if (name.empty() ? *s != '\0'
                     : *s != name[0] || std::strncmp(s, name.data(), name.size()) != 0 ||
                           s[name.size()] != '\0') {
      continue;
    }
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
