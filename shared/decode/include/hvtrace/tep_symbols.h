// Kernel symbols for libtraceevent through its function resolver
// (tep_set_function_resolver), so that the file's kallsyms is parsed by our
// KallsymsTable instead of tep_parse_kallsyms: that one sscanf()s each line,
// strdup()s every name and sorts the list, 13% of `hvtrace report` on
// bench/large.dat (122k symbols; perf, 2026-11-25).
//
// Answers are libtraceevent 1.7's, address for address: the same symbols
// (lines whose name starts with '$' and absolute 'A'/'a' symbols dropped),
// the same order (tep_register_function prepends, then a stable qsort by
// address, so aliases at one address are in reverse file order) and the
// same search (glibc's bsearch with libtraceevent's func_bcmp, whose probe
// order decides which alias an exact address gets, and whose last entry
// matches only its own address). Build() refuses a text whose lines do not
// all have the one shape both parsers read alike; the caller then hands the
// text to tep_parse_kallsyms as before.
#ifndef HVTRACE_SHARED_DECODE_TEP_SYMBOLS_H_
#define HVTRACE_SHARED_DECODE_TEP_SYMBOLS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/kallsyms_table.h"

struct tep_handle;

namespace hvtrace {

class TepSymbols {
 public:
  // Null when |kallsyms| holds a line tep_parse_kallsyms might read
  // differently from us (or stop at), or a NUL.
  static std::unique_ptr<TepSymbols> Build(std::string_view kallsyms);

  // Installs this table as |tep|'s resolver; it must outlive |tep|. One
  // table may serve several handles, on several threads (a parallel
  // report's decoders): nothing but looked_up() changes after Build.
  void Install(tep_handle* tep) const;

  // libtraceevent's find_func(): the symbol containing |addr| (nullptr if
  // none); its start in |*start| and module (or nullptr) in |*mod|.
  const char* Find(uint64_t addr, uint64_t* start, const char** mod) const;

  // What libtraceevent's test_for_symbol() gives a print-format atom naming
  // |name| had it parsed the kallsyms itself: the first symbol of that name
  // in its list, which is file order reversed until the first lookup
  // builds its sorted map (|map_built|), the sorted map after. 0 for none.
  // |*certain|: the answer does not depend on |map_built| (the name is
  // absent, or all its symbols share one address).
  uint64_t AtomValue(std::string_view name, bool map_built, bool* certain) const;

  // Whether Find has been called (libtraceevent would have built its map).
  bool looked_up() const { return looked_up_.load(std::memory_order_relaxed); }

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    uint64_t addr;
    uint32_t name;  // Offsets into strings_, NUL-terminated.
    uint32_t mod;   // UINT32_MAX: none.
    uint32_t file_index;
  };
  static char* Resolve(void* priv, unsigned long long* addrp, char** modp);
  // A byte of a name's length, first and last byte: names that differ in
  // it differ.
  static uint8_t Tag(std::string_view name);
  // Appends the entries of |symbols| (lines of |kallsyms|) in their order;
  // false when libtraceevent might read one of them otherwise.
  bool AddEntries(std::string_view kallsyms, std::span<const KallsymsTable::Symbol> symbols);

  std::string strings_;
  std::vector<Entry> entries_;  // libtraceevent's func_map order.
  // Beside |entries_|: Tag() of each name, for AtomValue's search.
  std::vector<uint8_t> tags_;
  mutable std::atomic<bool> looked_up_{false};
};

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_TEP_SYMBOLS_H_
