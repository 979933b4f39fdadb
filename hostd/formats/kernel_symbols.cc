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
    if (s.module) continue;
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

}  // namespace hvtrace::hostd
