// The few kallsyms lines a capture's events need. trace-cmd (libtraceevent)
// names an address by the last symbol at or below it, bounded by the next
// one; so keeping, for every value in the events that falls among the
// symbols, the symbol it is in, the next one and every alias at those
// addresses prints every address exactly as the whole table would -- and a
// trace.dat carries kilobytes of symbols instead of a kernel's ~5-7 MB
// (writing those dominated panic -> decoded). Values are read at every
// 4-byte offset of each payload, which covers every 8-byte field and array
// element.
#ifndef HVTRACE_HOSTD_KALLSYMS_SUBSET_H_
#define HVTRACE_HOSTD_KALLSYMS_SUBSET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/kallsyms_table.h"

namespace hvtrace::hostd {

class KallsymsSubset {
 public:
  // The symbols of /proc/kallsyms text |kallsyms| (kept by reference: it
  // must outlive this), parsed as |table| or, without one, now. Core-kernel
  // symbols are moved by |delta| (a KASLR difference; module symbols and
  // zero addresses stay).
  KallsymsSubset(std::string_view kallsyms, int64_t delta,
                 std::shared_ptr<const KallsymsTable> table = nullptr);

  bool empty() const { return lines_.empty(); }
  // Marks the symbols the values in |payload| fall in.
  void AddPayload(std::span<const std::byte> payload);
  // The marked lines and their neighbours and aliases, in address order.
  std::string Text() const;

 private:
  // One line as trace-cmd registers it ("ffffffff81000000 T _text", module
  // symbols end in "\t[mod]"; absolute symbols (A/a: per-CPU offsets) and
  // "$" names are not registered).
  struct Line {
    uint64_t addr = 0;      // Moved by delta.
    std::string_view text;  // The line, newline excluded.
    size_t digits = 0;      // Hex digits of the address at its start.
    bool movable = false;   // A core-kernel symbol: KASLR moves it.
  };
  void Mark(uint64_t value);

  int64_t delta_ = 0;
  std::vector<Line> lines_;
  std::vector<uint8_t> keep_;
  uint64_t lowest_ = 0;  // Values below name nothing worth printing.
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_KALLSYMS_SUBSET_H_
