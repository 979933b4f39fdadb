#include "module_symbols.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace hvtrace::hostd {
namespace {

constexpr uint64_t kPage = 4096;

// Whether entry |i|'s text overlaps that of a later entry of another module
// or base (a later load reused its memory).
bool Superseded(size_t i, const std::vector<BootMapModule>& loaded,
                const std::unordered_map<std::string_view, ModuleExtent>& extents) {
  auto span = [&](const BootMapModule& m) {
    const ModuleExtent& e = extents.at(m.name);
    return std::pair{m.addr, m.addr + (e.high - e.low / kPage * kPage)};
  };
  const auto [first, last] = span(loaded[i]);
  for (size_t j = i + 1; j < loaded.size(); ++j) {
    const bool same_load = loaded[j].name == loaded[i].name && loaded[j].addr == loaded[i].addr;
    if (same_load || !extents.contains(loaded[j].name)) continue;
    const auto [other_first, other_last] = span(loaded[j]);
    if (first <= other_last && other_first <= last) return true;
  }
  return false;
}

}  // namespace

ModuleSymbols MoveModuleSymbols(std::string_view kallsyms, const KernelSymbols& symbols,
                                const std::vector<BootMapModule>& loaded) {
  ModuleSymbols out;
  // Per harvested module, found when the formats loaded (ModuleExtent).
  const std::unordered_map<std::string_view, ModuleExtent>& extents = symbols.module_extents();
  // The entries placed: name -> the distinct bases it was loaded at.
  std::unordered_map<std::string_view, std::vector<uint64_t>> bases;
  std::unordered_set<std::string_view> missing;
  for (size_t i = 0; i < loaded.size(); ++i) {
    const BootMapModule& m = loaded[i];
    if (!extents.contains(m.name)) {
      if (missing.insert(m.name).second) out.not_harvested.push_back(m.name);
      continue;
    }
    if (Superseded(i, loaded, extents)) {
      out.superseded.push_back(m.name);
      continue;
    }
    std::vector<uint64_t>& at = bases[m.name];
    if (std::find(at.begin(), at.end(), m.addr) == at.end()) at.push_back(m.addr);
  }
  out.modules_moved = bases.size();
  for (const ModuleTextSymbol& m : symbols.module_text()) {
    const auto placed = bases.find(m.module);
    if (placed == bases.end()) continue;
    const KallsymsTable::Symbol& s = symbols.table().symbols()[m.index];
    const ModuleExtent& extent = extents.at(placed->first);
    if (!extent.Holds(s.addr)) continue;  // A stale __init symbol (ModuleExtent).
    const uint64_t offset = s.addr - extent.low / kPage * kPage;
    const std::string_view line = KallsymsTable::Line(kallsyms, s);
    for (uint64_t base : placed->second) {
      AppendKallsymsAddress(base + offset, 16, out.kallsyms);
      out.kallsyms.append(line.substr(s.digits));
      out.kallsyms.push_back('\n');
      ++out.symbols;
    }
  }
  return out;
}

}  // namespace hvtrace::hostd
