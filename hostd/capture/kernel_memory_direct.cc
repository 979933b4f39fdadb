#include "kernel_memory_direct.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernel_symbols.h"
#include "units.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

// CONFIG_PHYSICAL_ALIGN of x86_64 kernels (Debian's, and the minimum
// KASLR uses): the image starts at a multiple of it.
constexpr uint64_t kPhysicalAlign = 2ull << 20;
// __PAGE_OFFSET_BASE_L4: the direct map's base without CONFIG_RANDOMIZE_MEMORY.
constexpr uint64_t kDefaultPageOffset = 0xffff888000000000ull;
// The direct map spans at most 64 TiB (4-level) / 32 PiB (5-level); RAM
// bounds the translation in any case (GuestRam::Read refuses the rest).
constexpr uint64_t kDirectMapSpan = 1ull << 52;

Result<uint64_t> ReadWord(const GuestRam& ram, uint64_t gpa, const char* what) {
  uint64_t v = 0;
  if (Status s = ram.Read(gpa, std::as_writable_bytes(std::span(&v, 1))); !s.ok()) {
    return Error{std::string("reading ") + what + ": " + s.error().message};
  }
  return v;
}

// The physical address of `_text`: the one 2 MiB step of RAM whose banner
// bytes are |proc_version|'s, read in batches of one system call each (a
// 1 GiB guest: 527 steps, one batch); it stops at a second match.
Result<uint64_t> FindImage(const GuestRam& ram, uint64_t banner_offset,
                           std::string_view proc_version, json& info) {
  constexpr size_t kBatch = 1024;
  const size_t len = proc_version.size();
  std::vector<uint64_t> at;
  std::vector<std::byte> got(kBatch * len);
  std::vector<uint64_t> matches;
  uint64_t candidates = 0, read = 0;
  auto check = [&] {
    // A read that fails ends its system call's batch: go on after it.
    for (size_t from = 0; from < at.size();) {
      const size_t n =
          ram.ReadEach(std::span(at).subspan(from), len, std::span(got).subspan(from * len));
      read += n;
      for (size_t i = from; i < from + n; ++i) {
        if (std::memcmp(got.data() + i * len, proc_version.data(), len) == 0) {
          matches.push_back(at[i] - banner_offset);
        }
      }
      from += n + 1;
    }
    at.clear();
  };
  for (const GuestRamRange& r : ram.ranges()) {
    const uint64_t first = (r.gpa + kPhysicalAlign - 1) / kPhysicalAlign * kPhysicalAlign;
    for (uint64_t pa = first; pa + banner_offset + len <= r.gpa + r.bytes && matches.size() < 2;
         pa += kPhysicalAlign) {
      at.push_back(pa + banner_offset);
      ++candidates;
      if (at.size() == kBatch) check();
    }
  }
  if (!at.empty()) check();
  info["image_candidates"] = candidates;
  info["image_candidates_read"] = read;
  if (matches.size() != 1) {
    return Error{"the kernel's banner is at " +
                 std::string(matches.empty() ? "none" : "more than one") +
                 " of the 2 MiB steps of guest RAM (" + std::to_string(read) + " of " +
                 std::to_string(candidates) + " read)"};
  }
  return matches.front();
}

// Kernel virtual address -> guest-physical: the image, then the direct map.
struct Translation {
  uint64_t image_va = 0, image_pa = 0, image_bytes = 0, page_offset = 0;

  std::optional<uint64_t> ToPhysical(uint64_t va, size_t size) const {
    if (va >= image_va && va - image_va < image_bytes && size <= image_bytes - (va - image_va)) {
      return image_pa + (va - image_va);
    }
    if (va >= page_offset && va - page_offset < kDirectMapSpan) return va - page_offset;
    return std::nullopt;
  }
};

}  // namespace

Result<DirectKernelMemory> MapKernelMemory(std::shared_ptr<const GuestRam> ram,
                                           const KernelLogSymbols& sym,
                                           std::string_view proc_version,
                                           GuestMemoryRead fallback) {
  if (!ram || ram->ranges().empty()) return Error{"no guest RAM mapped"};
  if (!sym.text || !sym.stext || !sym.end || !sym.linux_banner || !sym.vmcoreinfo_data ||
      !sym.vmcoreinfo_size || proc_version.empty() || *sym.end <= *sym.text ||
      *sym.linux_banner < *sym.text || *sym.linux_banner >= *sym.end) {
    return Error{
        "the kernel's kallsyms lack _text, _stext, _end, linux_banner or vmcoreinfo_data/size"};
  }
  DirectKernelMemory out;
  json& info = out.info;
  Translation t;
  t.image_bytes = *sym.end - *sym.text;
  Result<uint64_t> image = FindImage(*ram, *sym.linux_banner - *sym.text, proc_version, info);
  if (!image.ok()) return image.error();
  t.image_pa = *image;
  const auto in_image = [&](uint64_t link) { return t.image_pa + (link - *sym.text); };
  if (sym.page_offset_base) {
    if (*sym.page_offset_base < *sym.text || *sym.page_offset_base >= *sym.end) {
      return Error{"page_offset_base is outside the kernel image"};
    }
    Result<uint64_t> base = ReadWord(*ram, in_image(*sym.page_offset_base), "page_offset_base");
    if (!base.ok()) return base.error();
    t.page_offset = *base;
  } else {
    t.page_offset = kDefaultPageOffset;
  }
  // KASLR puts the direct map at a 1 GiB step of the kernel half.
  if (t.page_offset < 0xff00000000000000ull || t.page_offset % (1ull << 30) != 0) {
    return Error{"the guest's page_offset_base " + HexText(t.page_offset) + " is no direct map"};
  }
  Result<uint64_t> data = ReadWord(*ram, in_image(*sym.vmcoreinfo_data), "vmcoreinfo_data");
  Result<uint64_t> size = ReadWord(*ram, in_image(*sym.vmcoreinfo_size), "vmcoreinfo_size");
  if (!data.ok()) return data.error();
  if (!size.ok()) return size.error();
  if (*size == 0 || *size > kMaxVmcoreinfoBytes || *data < t.page_offset) {
    return Error{"vmcoreinfo_data " + HexText(*data) + " (" + std::to_string(*size) +
                 " bytes) is not in the direct map"};
  }
  std::string text(*size, '\0');
  if (Status s = ram->Read(*data - t.page_offset, std::as_writable_bytes(std::span(text))); !s.ok())
    return Error{"reading VMCOREINFO: " + s.error().message};
  const Vmcoreinfo vmcoreinfo = Vmcoreinfo::Parse(text);
  const std::optional<uint64_t> stext = vmcoreinfo.Symbol("_stext");
  const std::optional<int64_t> phys_base = vmcoreinfo.Number("phys_base");
  if (!stext || !InKernelImage(*stext)) return Error{"VMCOREINFO has no usable SYMBOL(_stext)"};
  const int64_t delta = static_cast<int64_t>(*stext - *sym.stext);
  if (delta % static_cast<int64_t>(kPhysicalAlign) != 0 || !InKernelImage(*sym.text + delta)) {
    return Error{"VMCOREINFO's SYMBOL(_stext) " + HexText(*stext) +
                 " moves the kernel by no KASLR step"};
  }
  t.image_va = *sym.text + static_cast<uint64_t>(delta);
  // The image is where the kernel's own page tables say, or it is a stale
  // copy: _text's physical address = its offset in the image map
  // (__START_KERNEL_map = kImageStart) + phys_base.
  if (phys_base && t.image_pa != t.image_va - kImageStart + static_cast<uint64_t>(*phys_base)) {
    return Error{"the banner's image at " + HexText(t.image_pa) +
                 " is not where VMCOREINFO's phys_base puts the running kernel"};
  }
  out.kaslr_delta = delta;
  info["image_pa"] = HexText(t.image_pa);
  info["page_offset_base"] = HexText(t.page_offset);
  info["phys_base_checked"] = phys_base.has_value();
  out.read = [ram = std::move(ram), t, fallback = std::move(fallback)](
                 uint64_t va, size_t n) -> Result<std::vector<std::byte>> {
    if (const std::optional<uint64_t> pa = t.ToPhysical(va, n)) {
      std::vector<std::byte> bytes(n);
      if (ram->Read(*pa, bytes).ok()) return bytes;
    }
    if (fallback) return fallback(va, n);
    return Error{"kernel address " + HexText(va) + " is in neither the image nor guest RAM"};
  };
  return out;
}

}  // namespace hvtrace::hostd
