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

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernel_symbols.h"

namespace hvtrace::hostd {

class KallsymsSubset {
 public:
  // The symbols of /proc/kallsyms text |kallsyms| (kept by reference: it
  // must outlive this), as |symbols| indexed them or, without, indexed now.
  // Core-kernel symbols are moved by |delta| (a KASLR difference; module
  // symbols and zero addresses stay). Nothing is copied per subset but a
  // mark per symbol.
  // |with_modules| false leaves module symbols out (their addresses are
  // the harvest's; see module_symbols.h for where a boot had them).
  KallsymsSubset(std::string_view kallsyms, int64_t delta,
                 std::shared_ptr<const KernelSymbols> symbols = nullptr, bool with_modules = true);

  bool empty() const { return lowest_ == 0; }
  // Marks the symbols the values in |payload| fall in, and in |also| too
  // when given: one pass over the payload for both (a boot's core symbols
  // and its moved module symbols, module_symbols.h).
  void AddPayload(std::span<const std::byte> payload, KallsymsSubset* also = nullptr);
  // The marked lines and their neighbours and aliases, in address order.
  std::string Text() const;

 private:
  // One of the two address-ordered lists of KernelSymbols (movable: moved
  // by delta_, fixed: not), and its marks.
  struct List {
    std::span<const uint32_t> index;
    int64_t delta = 0;
    std::vector<uint8_t> keep;
  };
  uint64_t Addr(const List& list, size_t i) const;
  // How many of |list|'s symbols are at or below (below) |value|.
  size_t CountAtOrBelow(const List& list, uint64_t value) const;
  size_t CountBelow(const List& list, uint64_t value) const;
  void Mark(uint64_t value);
  // Marks |value|'s symbols (it is at least lowest_) unless marked lately.
  void MarkOnce(uint64_t value);
  void AppendLine(const List& list, size_t i, std::string& out) const;
  void AppendAliases(uint64_t at, std::string& out) const;

  std::string_view text_;
  std::shared_ptr<const KernelSymbols> symbols_;
  std::vector<uint32_t> fixed_kept_;  // The fixed list without modules, when asked.
  List movable_, fixed_;
  uint64_t lowest_ = 0;                // Values below name nothing worth printing; 0: no symbols.
  std::array<uint64_t, 1024> seen_{};  // Values marked lately (0: none; 0 < lowest_).
};
// A boot's moved module symbols (module_symbols.h): their kallsyms text and
// its index, made once and shared by every subset of that boot.
struct ModuleKallsyms {
  std::string text;
  std::shared_ptr<const KernelSymbols> symbols;
};

// The symbols one boot's events need, as its trace.dat carries them: the
// core symbols moved by |delta| (the harvest's module symbols left out),
// then the boot's moved module symbols when |modules| holds any (kept by
// reference, as |kallsyms|). Each payload is scanned once for both.
class BootKallsyms {
 public:
  BootKallsyms(std::string_view kallsyms, int64_t delta,
               std::shared_ptr<const KernelSymbols> symbols, const ModuleKallsyms* modules);
  bool empty() const { return core_.empty(); }
  void AddPayload(std::span<const std::byte> payload) {
    core_.AddPayload(payload, modules_ ? &*modules_ : nullptr);
  }
  std::string Text() const;

 private:
  KallsymsSubset core_;
  std::optional<KallsymsSubset> modules_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_KALLSYMS_SUBSET_H_
