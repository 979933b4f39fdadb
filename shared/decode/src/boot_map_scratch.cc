// struct trace_scratch of a 6.15+ persistent buffer (kernel/trace/trace.c):
// the tracer's record of the boot that last wrote the range, its _text and
// the text base of each module it had loaded. The guest writes it: every
// field is checked, a bad entry is skipped and counted, and the two known
// forms are told apart by where a kernel text address stands.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "boot_map_internal.h"

namespace hvtrace::boot_map {
namespace {

// x86-64's kernel image and module areas (Documentation/arch/x86/x86_64/mm.rst):
// the image is mapped within 1 GiB (512 MiB without KASLR) from
// __START_KERNEL_map, modules from its end to the fixmap.
constexpr uint64_t kImageStart = 0xffffffff80000000;
constexpr uint64_t kModulesStart = 0xffffffffc0000000;
constexpr uint64_t kModulesEnd = 0xffffffffff000000;
constexpr uint64_t kModNameLen = 56;  // MODULE_NAME_LEN: 64 - sizeof(unsigned long).
constexpr uint64_t kEntrySize = 8 + kModNameLen;
constexpr uint32_t kMaxClockId = 64;  // trace_clocks[] has about a dozen.

bool KernelText(uint64_t addr) { return addr >= kImageStart && addr < kModulesStart; }

bool ModuleNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

// One entry, or false with |why| when it fails a check.
bool ReadEntry(std::span<const std::byte> entry, BootMapModule* out, std::string* why) {
  out->addr = Load<uint64_t>(entry, 0);
  const char* name = reinterpret_cast<const char*>(entry.data() + 8);
  const size_t len = std::find(name, name + kModNameLen, '\0') - name;
  if (len == kModNameLen) {
    *why = "mod_name has no NUL in its 56 bytes";
    return false;
  }
  if (len == 0 || !std::all_of(name, name + len, ModuleNameChar)) {
    *why = "mod_name is empty or has a byte a module name cannot have";
    return false;
  }
  out->name.assign(name, len);
  if (out->addr < kModulesStart || out->addr >= kModulesEnd) {
    *why = "mod_addr " + Hex(out->addr) + " of " + out->name + " is outside the module area";
    return false;
  }
  return true;
}

}  // namespace

BootMapScratch ParseScratch(std::span<const std::byte> scratch, uint64_t offset) {
  BootMapScratch s;
  s.present = true;
  s.offset = offset;
  s.size = scratch.size();
  // 6.16+ put a u32 clock_id first (the u64 after it aligned to 8); 6.15
  // starts with text_addr. A zero area (written by no boot yet) is neither.
  uint64_t header = 0;
  if (scratch.size() >= 16 && KernelText(Load<uint64_t>(scratch, 0))) {
    s.layout = "text_addr";
    s.text_addr = Load<uint64_t>(scratch, 0);
    s.nr_entries = Load<uint64_t>(scratch, 8);
    header = 16;
  } else if (scratch.size() >= 24 && Load<uint32_t>(scratch, 0) < kMaxClockId &&
             KernelText(Load<uint64_t>(scratch, 8))) {
    s.layout = "clock_id";
    s.clock_id = Load<uint32_t>(scratch, 0);
    s.text_addr = Load<uint64_t>(scratch, 8);
    s.nr_entries = Load<uint64_t>(scratch, 16);
    header = 24;
  } else {
    s.problems.push_back("no kernel text address at +0 or +8 of the " +
                         std::to_string(scratch.size()) +
                         "-byte scratch area: not written by a boot, or a form not known");
    return s;
  }
  const uint64_t capacity = (scratch.size() - header) / kEntrySize;
  uint64_t n = s.nr_entries;
  if (n > capacity) {
    s.problems.push_back("nr_entries " + std::to_string(n) + " is more than the " +
                         std::to_string(capacity) + " entries the area holds; " +
                         std::to_string(capacity) + " read");
    n = capacity;
  }
  for (uint64_t i = 0; i < n; ++i) {
    BootMapModule m;
    std::string why;
    if (ReadEntry(scratch.subspan(header + i * kEntrySize, kEntrySize), &m, &why)) {
      s.modules.push_back(std::move(m));
    } else if (s.bad_entries++ == 0) {
      s.problems.push_back("entry " + std::to_string(i) + " at " +
                           Hex(offset + header + i * kEntrySize) + ": " + why +
                           " (bad entries are skipped)");
    }
  }
  return s;
}

}  // namespace hvtrace::boot_map
