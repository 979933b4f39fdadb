// Module symbols where the captured boot had its modules. A harvest reads
// kallsyms in a boot of its own, where each module was loaded somewhere
// else; a 6.15+ range's scratch area says where the boot that wrote it had
// each module's text (BootMapScratch::modules, mod->mem[MOD_TEXT].base).
// Each module's text symbols are moved by (its base there - its base at the
// harvest), so function pointers into modules (timer and workqueue
// callbacks, call_site, ip) print by name in trace-cmd and `hvtrace show`.
//
// The harvest's base of a module is its lowest text symbol rounded down to a
// page: module text is allocated page aligned and starts with its first
// function (or that function's __pfx_ padding). Only text symbols move: a
// module's data lives in other allocations the scratch area does not record.
// Modules the harvest did not load, or the boot did not have, are left out,
// so nothing names an address by another boot's module layout.
//
// The kernel appends an entry each time a module loads and removes none when
// it unloads (trace.c, save_mod), so a module loaded again has two entries;
// events from before the reload point into the first. Every entry's text is
// placed. Where an entry's text (extent: the harvest's lowest to highest text
// symbol) overlaps a later entry of another address, the later load reused
// that memory: the older entry is left out (`superseded`), as an address
// there cannot be told to belong to one or the other.
#ifndef HVTRACE_HOSTD_CAPTURE_MODULE_SYMBOLS_H_
#define HVTRACE_HOSTD_CAPTURE_MODULE_SYMBOLS_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/boot_map.h"
#include "kernel_symbols.h"

namespace hvtrace::hostd {

struct ModuleSymbols {
  std::string kallsyms;  // "addr t name\t[module]" lines, moved.
  size_t modules_moved = 0;
  size_t symbols = 0;
  std::vector<std::string> not_harvested;  // In the scratch area, no symbols at the harvest.
  std::vector<std::string> superseded;     // Entries whose memory a later load reused.
};

// The text symbols of the modules in |loaded|, taken from |symbols| (the
// harvest's indexed kallsyms, |kallsyms| its text).
ModuleSymbols MoveModuleSymbols(std::string_view kallsyms, const KernelSymbols& symbols,
                                const std::vector<BootMapModule>& loaded);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_MODULE_SYMBOLS_H_
