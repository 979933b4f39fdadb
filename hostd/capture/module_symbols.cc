#include "module_symbols.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>

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

}  // namespace

ModuleSymbols MoveModuleSymbols(std::string_view kallsyms, const KernelSymbols& symbols,
                                const std::vector<BootMapModule>& loaded) {
  ModuleSymbols out;
  std::unordered_map<std::string_view, uint64_t> base_then;  // Name -> scratch base.
  for (const BootMapModule& m : loaded) base_then.emplace(m.name, m.addr);
  // Per module, its text symbols' lowest address at the harvest.
  std::unordered_map<std::string_view, uint64_t> lowest;
  const auto& all = symbols.table().symbols();
  for (const KallsymsTable::Symbol& s : all) {
    if (!s.module || !IsText(s.type) || s.addr == 0) continue;
    const std::string_view mod = ModuleOf(KallsymsTable::Line(kallsyms, s));
    if (!base_then.contains(mod)) continue;
    auto [it, fresh] = lowest.emplace(mod, s.addr);
    if (!fresh) it->second = std::min(it->second, s.addr);
  }
  for (const BootMapModule& m : loaded) {
    if (!lowest.contains(m.name)) out.not_harvested.push_back(m.name);
  }
  out.modules_moved = lowest.size();
  for (const KallsymsTable::Symbol& s : all) {
    if (!s.module || !IsText(s.type) || s.addr == 0) continue;
    const std::string_view line = KallsymsTable::Line(kallsyms, s);
    const std::string_view mod = ModuleOf(line);
    const auto low = lowest.find(mod);
    if (low == lowest.end()) continue;
    const uint64_t moved = s.addr - low->second / kPage * kPage + base_then.at(mod);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(moved));
    out.kallsyms.append(hex);
    out.kallsyms.append(line.substr(s.digits));
    out.kallsyms.push_back('\n');
    ++out.symbols;
  }
  return out;
}

}  // namespace hvtrace::hostd
