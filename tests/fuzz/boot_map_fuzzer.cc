// Fuzzes the boot_map reader with whole ranges, every layout. Seeds
// (tests/fixtures/fuzz/boot_map/make_seeds.py): 64 KiB single-CPU 6.12 ranges
// built from real 6.12 pages, and 128 KiB 6.15+ ranges (one and two CPUs)
// with the real 7.3 range's global meta, scratch area and pages.
#include <cstddef>
#include <cstdint>
#include <span>

#include "hvtrace/boot_map.h"
#include "hvtrace/page.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const std::span<const std::byte> range(reinterpret_cast<const std::byte*>(data), size);
  hvtrace::BootMapOptions options;  // Default layout: 4096-byte pages, data at 16.
  for (int cpus : {0, 1, 2}) {
    options.cpus = cpus;
    auto map = hvtrace::ReadBootMap(range, options);
    if (!map.ok()) continue;
    // Touch every byte handed out so the sanitizers see any bad span.
    uint64_t sum = 0;
    for (const hvtrace::BootMapCpu& cpu : map->cpu) {
      for (const hvtrace::BootMapRecord& r : cpu.records) {
        for (std::byte b : r.payload) sum += static_cast<uint8_t>(b);
        if (r.page >= cpu.pages.size()) __builtin_trap();
      }
      for (const hvtrace::BootMapPage& p : cpu.pages) {
        if (p.offset + 4096 > size) __builtin_trap();
      }
    }
    for (const hvtrace::BootMapModule& m : map->scratch.modules) sum += m.name.size() + m.addr;
    if (sum == 1) return 1;  // Keeps |sum| alive.
  }
  return 0;
}
