#include "module_symbols.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace hvtrace::hostd {
namespace {

constexpr uint64_t kPage = 4096;

bool IsText(char type) { return type == 't' || type == 'T' || type == 'w' || type == 'W'; }

// "\t[name]" at the end of a module symbol's line.
std::string_view ModuleOf(std::string_view line) {
  if (line.empty() || line.back() != ']') return {};
  const size_t open = line.rfind('[');
  if (open == std::string_view::npos) return {};
  return line.substr(open + 1, line.size() - open - 2);
}

// Per harvested module, its core text: from its lowest text symbol to its
// highest one below |limit|, the next module's lowest text symbol in the
// same kallsyms. Above that limit a module's name can still appear: 7.3's
// kallsyms keeps some __init functions at the addresses of the module's
// freed init text, which the next module's core then reused (seen on Debian
// 7.3.4: `pvpanic_mmio_driver_init` at pvpanic_pci_probe's address). Such a
// symbol widened the extent over the next module, which then "superseded"
// the first, and it would have named the next module's code after it.
struct Extent {
  uint64_t low = UINT64_MAX, high = 0, limit = UINT64_MAX;
  bool Holds(uint64_t addr) const { return addr >= low && addr < limit; }
};

std::unordered_map<std::string_view, Extent> HarvestExtents(
    std::string_view kallsyms, const KernelSymbols& symbols,
    const std::vector<BootMapModule>& loaded) {
  std::unordered_map<std::string_view, Extent> all;
  auto module_text = [&](auto&& visit) {
    for (const KallsymsTable::Symbol& s : symbols.table().symbols()) {
      if (!s.module || !IsText(s.type) || s.addr == 0) continue;
      visit(ModuleOf(KallsymsTable::Line(kallsyms, s)), s.addr);
    }
  };
  module_text([&](std::string_view mod, uint64_t addr) {
    Extent& e = all[mod];
    e.low = std::min(e.low, addr);
  });
  std::vector<uint64_t> lows;
  for (const auto& [mod, e] : all) lows.push_back(e.low);
  std::sort(lows.begin(), lows.end());
  for (auto& [mod, e] : all) {
    const auto next = std::upper_bound(lows.begin(), lows.end(), e.low);
    if (next != lows.end()) e.limit = *next;
  }
  module_text([&](std::string_view mod, uint64_t addr) {
    Extent& e = all[mod];
    if (e.Holds(addr)) e.high = std::max(e.high, addr);
  });
  std::unordered_map<std::string_view, Extent> out;
  for (const BootMapModule& m : loaded) {
    if (const auto it = all.find(m.name); it != all.end()) out.emplace(it->first, it->second);
  }
  return out;
}

// Whether entry |i|'s text overlaps that of a later entry of another module
// or base (a later load reused its memory).
bool Superseded(size_t i, const std::vector<BootMapModule>& loaded,
                const std::unordered_map<std::string_view, Extent>& extents) {
  auto span = [&](const BootMapModule& m) {
    const Extent& e = extents.at(m.name);
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
  const std::unordered_map<std::string_view, Extent> extents =
      HarvestExtents(kallsyms, symbols, loaded);
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
  for (const KallsymsTable::Symbol& s : symbols.table().symbols()) {
    if (!s.module || !IsText(s.type) || s.addr == 0) continue;
    const std::string_view line = KallsymsTable::Line(kallsyms, s);
    const auto placed = bases.find(ModuleOf(line));
    if (placed == bases.end()) continue;
    const Extent& extent = extents.at(placed->first);
    if (!extent.Holds(s.addr)) continue;  // A stale __init symbol (HarvestExtents).
    const uint64_t offset = s.addr - extent.low / kPage * kPage;
    for (uint64_t base : placed->second) {
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(base + offset));
      out.kallsyms.append(hex);
      out.kallsyms.append(line.substr(s.digits));
      out.kallsyms.push_back('\n');
      ++out.symbols;
    }
  }
  return out;
}

}  // namespace hvtrace::hostd
