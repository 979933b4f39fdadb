#include "hvtrace/kallsyms_table.h"

#include <algorithm>
#include <charconv>

namespace hvtrace {

std::shared_ptr<const KallsymsTable> KallsymsTable::Parse(std::string_view kallsyms) {
  auto table = std::make_shared<KallsymsTable>();
  std::vector<Symbol>& out = table->symbols_;
  out.reserve(kallsyms.size() / 40);
  // Offsets are 32-bit: formats_cache caps kallsyms far below 4 GiB.
  const std::string_view text = kallsyms.substr(0, UINT32_MAX);
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(pos, nl - pos);
    Symbol s;
    s.offset = static_cast<uint32_t>(pos);
    s.length = static_cast<uint32_t>(line.size());
    pos = nl + 1;
    const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), s.addr, 16);
    const size_t digits = static_cast<size_t>(end - line.data());
    if (ec != std::errc() || digits > 16 || line.size() < digits + 4 || line[digits] != ' ' ||
        line[digits + 2] != ' ') {
      continue;
    }
    s.digits = static_cast<uint8_t>(digits);
    s.type = line[digits + 1];
    s.module = line.find('[', digits + 3) != std::string_view::npos;
    out.push_back(s);
  }
  // /proc/kallsyms is in address order but for a few stragglers.
  auto by_addr = [](const Symbol& a, const Symbol& b) { return a.addr < b.addr; };
  if (!std::is_sorted(out.begin(), out.end(), by_addr))
    std::stable_sort(out.begin(), out.end(), by_addr);
  return table;
}

std::string_view KallsymsTable::Name(std::string_view kallsyms, const Symbol& s) {
  return Line(kallsyms, s).substr(s.digits + 3u);
}

}  // namespace hvtrace
