#include "kernel_symbols.h"

#include <algorithm>
#include <charconv>

namespace hvtrace::hostd {
namespace {

bool IsFunction(char type) { return type == 't' || type == 'T' || type == 'w' || type == 'W'; }

// Registered by trace-cmd (trace-util.c skips absolute and '$' names).
bool Nameable(const KallsymsTable::Symbol& s, std::string_view name) {
  return s.type != 'A' && s.type != 'a' && !name.starts_with('$');
}

void FirstInFile(std::optional<uint64_t>& addr, uint32_t& offset, const KallsymsTable::Symbol& s) {
  if (s.addr == 0 || (addr && s.offset >= offset)) return;
  addr = s.addr;
  offset = s.offset;
}

std::vector<uint64_t> ImageFormats(std::string_view text) {
  std::vector<uint64_t> out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl == std::string_view::npos ? text.size() : nl);
    text.remove_prefix(std::min(text.size(), line.size() + 1));
    uint64_t addr = 0;
    if (!line.starts_with("0x")) continue;
    const auto [end, ec] = std::from_chars(line.data() + 2, line.data() + line.size(), addr, 16);
    if (ec == std::errc() && InKernelImage(addr)) out.push_back(addr);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// "\t[name]" at the end of a module symbol's line.
std::string_view ModuleOf(std::string_view line) {
  if (line.empty() || line.back() != ']') return {};
  const size_t open = line.rfind('[');
  if (open == std::string_view::npos) return {};
  return line.substr(open + 1, line.size() - open - 2);
}

// Each module's extent (ModuleExtent) from its text symbols. Its limit is
// the next module's lowest text symbol: above it a module's name can still
// appear, as 7.3's kallsyms keeps some __init functions at the addresses of
// the module's freed init text, which the next module's core then reused
// (Debian 7.3.4: `pvpanic_mmio_driver_init` at pvpanic_pci_probe's
// address). Such a symbol widened the extent over the next module, which
// then "superseded" the first, and named the next module's code after it.
std::unordered_map<std::string_view, ModuleExtent> ModuleExtents(
    const KallsymsTable& table, std::span<const ModuleTextSymbol> text) {
  std::unordered_map<std::string_view, ModuleExtent> out;
  for (const ModuleTextSymbol& m : text) {
    ModuleExtent& e = out[m.module];
    e.low = std::min(e.low, table.symbols()[m.index].addr);
  }
  std::vector<uint64_t> lows;
  for (const auto& [mod, e] : out) lows.push_back(e.low);
  std::sort(lows.begin(), lows.end());
  for (auto& [mod, e] : out) {
    const auto next = std::upper_bound(lows.begin(), lows.end(), e.low);
    if (next != lows.end()) e.limit = *next;
  }
  for (const ModuleTextSymbol& m : text) {
    ModuleExtent& e = out[m.module];
    const uint64_t addr = table.symbols()[m.index].addr;
    if (e.Holds(addr)) e.high = std::max(e.high, addr);
  }
  return out;
}

// The kernel log reader's symbols (ImageSymbols): the last line wins.
void NoteLogSymbol(ImageSymbols& ix, std::string_view name, uint64_t addr) {
  if (InKernelImage(addr)) ix.image_last = std::max(ix.image_last, addr);
  KernelLogSymbols& log = ix.log;
  if (name == "_stext") log.stext = addr;
  if (name == "_end") log.end = addr;
  if (name == "linux_banner") log.linux_banner = addr;
  if (name == "vmcoreinfo_data") log.vmcoreinfo_data = addr;
  if (name == "vmcoreinfo_size") log.vmcoreinfo_size = addr;
  if (name == "page_offset_base") log.page_offset_base = addr;
}

}  // namespace

std::shared_ptr<const KernelSymbols> KernelSymbols::Build(std::string_view kallsyms,
                                                          std::string_view printk_formats) {
  auto out = std::make_shared<KernelSymbols>();
  out->table_ = KallsymsTable::Parse(kallsyms);
  ImageSymbols& ix = out->image_;
  std::vector<uint64_t> all;  // Every image symbol's address, sorted.
  uint64_t stext = 0, etext = 0;
  uint32_t text_at = 0, meta_at = 0;
  const auto symbols = out->table_->symbols();
  for (uint32_t i = 0; i < symbols.size(); ++i) {
    const KallsymsTable::Symbol& s = symbols[i];
    const std::string_view name = KallsymsTable::Name(kallsyms, s);
    if (Nameable(s, name)) (s.addr != 0 && !s.module ? out->movable_ : out->fixed_).push_back(i);
    if (s.module) {
      if (IsFunction(s.type) && s.addr != 0) {
        out->module_text_.push_back({i, ModuleOf(KallsymsTable::Line(kallsyms, s))});
      }
      continue;
    }
    if (name == "_text") FirstInFile(ix.text, text_at, s);
    if (name == "rb_meta_init_text_addr") FirstInFile(ix.meta_init_text_addr, meta_at, s);
    NoteLogSymbol(ix, name, s.addr);
    // Module symbols were the harvest boot's; absolute ones are not code.
    if (!InKernelImage(s.addr) || s.type == 'A' || s.type == 'a') continue;
    all.push_back(s.addr);
    if (name == "_stext") stext = s.addr;
    if (name == "_etext") etext = s.addr;
    if (name == "tracing_mark_write") ix.marker_lo = s.addr;
    if (IsFunction(s.type) && !name.starts_with("__pfx_") && !name.starts_with("__cfi_")) {
      ix.starts.push_back(s.addr);
    }
  }
  out->module_extents_ = ModuleExtents(*out->table_, out->module_text_);
  ix.log.text = ix.text;
  ix.formats = ImageFormats(printk_formats);
  ix.starts.erase(std::unique(ix.starts.begin(), ix.starts.end()), ix.starts.end());
  if (ix.starts.empty()) return out;
  ix.text_lo = stext != 0 ? stext : ix.starts.front();
  ix.text_hi = etext > ix.text_lo ? etext : all.back() + 1;
  if (ix.marker_lo != 0) {
    auto next = std::upper_bound(all.begin(), all.end(), ix.marker_lo);
    ix.marker_hi = next != all.end() ? *next : 0;
    if (ix.marker_hi == 0) ix.marker_lo = 0;  // Its end is unknown: not evidence.
  }
  return out;
}

void AppendKallsymsAddress(uint64_t addr, size_t width, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  char hex[16];
  size_t n = 0;
  do {
    hex[sizeof hex - ++n] = kHex[addr & 0xf];
    addr >>= 4;
  } while (addr != 0);
  if (n < width) out.append(width - n, '0');
  out.append(hex + sizeof hex - n, n);
}

}  // namespace hvtrace::hostd
