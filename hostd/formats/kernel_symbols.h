// What a capture asks of a kernel's kallsyms, worked out once when the
// kernel's formats load (FormatCache::Load), not per panic: the KASLR
// evidence's function starts and text bounds, and the symbols a trace.dat
// may name, in address order. Walking the ~200,000 symbols of a 6.12 kernel
// by name took 9-30 ms per boot at panic time (bench/README.md,
// capture_latency.sh `kaslr` and `syms`).
#ifndef HVTRACE_HOSTD_FORMATS_KERNEL_SYMBOLS_H_
#define HVTRACE_HOSTD_FORMATS_KERNEL_SYMBOLS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hvtrace/kallsyms_table.h"

namespace hvtrace::hostd {

// x86_64's kernel image area: KASLR moves the image inside it; modules
// start at its end.
constexpr uint64_t kImageStart = 0xffffffff80000000ull;
constexpr uint64_t kImageEnd = 0xffffffffc0000000ull;
inline bool InKernelImage(uint64_t v) { return v >= kImageStart && v < kImageEnd; }

// The guest kernel's link-time addresses (its kallsyms) a read of its log
// from guest memory starts from (kernel_memory_direct.h).
struct KernelLogSymbols {
  std::optional<uint64_t> text, stext, end;  // _text, _stext, _end (or the last image symbol).
  std::optional<uint64_t> linux_banner, vmcoreinfo_data, vmcoreinfo_size, page_offset_base;
};

// The kernel image's symbols (0xffffffff80000000..0xffffffffc0000000, no
// module or absolute ones) as the KASLR evidence reads them.
struct ImageSymbols {
  std::vector<uint64_t> starts;   // Function starts (t/T/w/W, no __pfx_/__cfi_), sorted, unique.
  std::vector<uint64_t> formats;  // printk_formats addresses in the image, sorted, unique.
  uint64_t text_lo = 0, text_hi = 0;      // _stext.._etext, or the symbols' span.
  uint64_t marker_lo = 0, marker_hi = 0;  // tracing_mark_write .. the next symbol; 0 if unknown.
  // The first "_text" and "rb_meta_init_text_addr" lines' addresses (the
  // 6.12 meta's text_addr is relative to one of them).
  std::optional<uint64_t> text, meta_init_text_addr;
  // What a read of the kernel's log from guest memory starts from: the last
  // core-kernel line of each name (|log.text| is |text|), and the highest
  // image address of any. Found here, with the rest: a walk of the symbols
  // by name at the panic was ~40 % of that step's instructions.
  KernelLogSymbols log;
  uint64_t image_last = 0;
};

// A module's text in the harvest guest (module_symbols.h): from its lowest
// text symbol to |limit|, the next module's lowest one; |high| is its
// highest text symbol below that limit.
struct ModuleExtent {
  uint64_t low = UINT64_MAX, high = 0, limit = UINT64_MAX;
  bool Holds(uint64_t addr) const { return addr >= low && addr < limit; }
};

// A text symbol (t/T/w/W, non-zero address) of a module the harvest loaded.
struct ModuleTextSymbol {
  uint32_t index = 0;       // Into KernelSymbols::table().symbols().
  std::string_view module;  // The name in its line's "[name]".
};

class KernelSymbols {
 public:
  // |kallsyms| must outlive the result (the table keeps offsets into it).
  static std::shared_ptr<const KernelSymbols> Build(std::string_view kallsyms,
                                                    std::string_view printk_formats);

  const KallsymsTable& table() const { return *table_; }
  const ImageSymbols& image() const { return image_; }
  // The symbols trace-cmd registers (no A/a or '$' names), as indices into
  // table().symbols() in address order: core-kernel ones, which a KASLR
  // delta moves, and the others (modules, zero addresses), which stay.
  std::span<const uint32_t> movable() const { return movable_; }
  std::span<const uint32_t> fixed() const { return fixed_; }
  // The harvest's module text symbols in the table's order, and each
  // module's extent: what moving them to a captured boot's module bases
  // reads (MoveModuleSymbols), found here rather than by walking all the
  // symbols at each panic.
  std::span<const ModuleTextSymbol> module_text() const { return module_text_; }
  const std::unordered_map<std::string_view, ModuleExtent>& module_extents() const {
    return module_extents_;
  }

 private:
  std::shared_ptr<const KallsymsTable> table_;
  ImageSymbols image_;
  std::vector<uint32_t> movable_, fixed_;
  std::vector<ModuleTextSymbol> module_text_;
  std::unordered_map<std::string_view, ModuleExtent> module_extents_;
};

// Appends |addr| as a kallsyms line spells it: lower-case hex zero-padded to
// |width| digits (more when it needs them), as "%0*llx" prints it. Written
// by hand: snprintf per line was 1.6 M of the capture thread's ~22 M
// instructions at a 6.12 panic (KallsymsSubset) and 0.76 M of
// MoveModuleSymbols' 0.94 M at a 7.3 one (callgrind, bench/README.md).
void AppendKallsymsAddress(uint64_t addr, size_t width, std::string& out);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FORMATS_KERNEL_SYMBOLS_H_
