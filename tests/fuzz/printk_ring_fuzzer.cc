// Fuzzes the printk ring reader: the input is VMCOREINFO text, a NUL, then a
// memory record (hvtrace/memory_record.h, uncompressed) standing for guest
// memory. No committed seeds yet: the real 6.12 and 7.3 guests' records
// (tests/fixtures/printk_ring/, vmcoreinfo.txt + NUL + the decompressed
// printk-memory.zst) are the inputs to seed it with.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "hvtrace/memory_record.h"
#include "hvtrace/printk_ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (8u << 20)) return 0;
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  if (nul == std::string_view::npos) return 0;
  const hvtrace::Vmcoreinfo info = hvtrace::Vmcoreinfo::Parse(all.substr(0, nul));
  auto memory =
      hvtrace::MemoryRecord::Parse(std::as_bytes(std::span(data + nul + 1, size - nul - 1)));
  if (!memory.ok()) return 0;
  auto log =
      hvtrace::ReadPrintkRing(info, [&](uint64_t addr, size_t n) { return memory->Read(addr, n); });
  if (!log.ok()) return 0;
  uint64_t sum = 0;
  for (const hvtrace::KernelLogRecord& r : log->records) {
    if (r.text.size() > hvtrace::kMaxKernelLogLine) __builtin_trap();
    sum += hvtrace::PrintableLogText(r.text).size();
  }
  return sum == 1 ? 1 : 0;
}
