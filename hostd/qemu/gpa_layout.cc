#include "gpa_layout.h"

#include <cstdio>
#include <string>

#include "units.h"

namespace hvtrace::hostd {
namespace {

std::string MiB(uint64_t v) {
  if (v % kMiB == 0) return std::to_string(v / kMiB) + " MiB";
  return std::to_string(v) + " bytes";
}

}  // namespace

uint64_t LowMemoryLimit(MachineType machine, uint64_t memory_bytes) {
  // Mirrors hw/i386/pc_piix.c and pc_q35.c (QEMU 7.2) with default
  // max-ram-below-4g.
  if (machine == MachineType::kQ35) {
    return memory_bytes >= 0xb0000000ull ? 0x80000000ull : 0xb0000000ull;
  }
  return memory_bytes >= 0xe0000000ull ? 0xc0000000ull : 0xe0000000ull;
}

Result<BootRangeLayout> ComputeBootRangeLayout(const BootRangeRequest& request) {
  const uint64_t memory = request.memory_bytes;
  const uint64_t range = request.range_bytes;
  if (range == 0 || range % kGuestPageSize != 0) {
    return Error{"boot range size " + std::to_string(range) +
                 " is not a non-zero multiple of the " + std::to_string(kGuestPageSize) +
                 "-byte page size"};
  }
  if (memory == 0 || memory % kNodeAlignment != 0) {
    return Error{"guest memory " + std::to_string(memory) +
                 " bytes is not a non-zero multiple of " + MiB(kNodeAlignment) +
                 ", needed to split it into NUMA nodes"};
  }
  const uint64_t low_limit = LowMemoryLimit(request.machine, memory);
  if (memory > low_limit) {
    // Beyond the limit QEMU moves the rest of RAM above 4 GiB and node 1 is no
    // longer contiguous with node 0; refuse rather than guess the split.
    return Error{"guest memory " + MiB(memory) + " does not fit below the low-memory limit " +
                 HexText(low_limit) + " of this machine type; a boot range needs all RAM below it"};
  }

  BootRangeLayout layout;
  layout.range_bytes = range;
  const uint64_t needed_node1 = range + kBootRangeHeadroom;
  if (request.node0_bytes == 0) {
    layout.node1_bytes = (needed_node1 + kNodeAlignment - 1) / kNodeAlignment * kNodeAlignment;
    if (layout.node1_bytes >= memory) {
      return Error{"boot range of " + MiB(range) + " needs node 1 of " + MiB(layout.node1_bytes) +
                   " (range + " + MiB(kBootRangeHeadroom) +
                   " headroom), more than all guest memory " + MiB(memory)};
    }
    layout.node0_bytes = memory - layout.node1_bytes;
  } else {
    if (request.node0_bytes % kNodeAlignment != 0) {
      return Error{"boot range address " + HexText(request.node0_bytes) + " (node 0 size) is not " +
                   MiB(kNodeAlignment) + " aligned"};
    }
    if (request.node0_bytes >= memory) {
      return Error{"boot range address " + HexText(request.node0_bytes) +
                   " is beyond guest memory " + MiB(memory)};
    }
    layout.node0_bytes = request.node0_bytes;
    layout.node1_bytes = memory - request.node0_bytes;
    if (layout.node1_bytes < needed_node1) {
      return Error{"boot range of " + MiB(range) + " is too large for its node: node 1 at " +
                   HexText(layout.node0_bytes) + " has " + MiB(layout.node1_bytes) +
                   ", needs at least " + MiB(needed_node1) + " (range + " +
                   MiB(kBootRangeHeadroom) + " headroom)"};
    }
  }
  if (layout.node0_bytes < kMinNode0Bytes) {
    return Error{"node 0 would have only " + MiB(layout.node0_bytes) +
                 "; the guest needs at least " + MiB(kMinNode0Bytes) + " below the boot range"};
  }
  layout.range_gpa = layout.node0_bytes;
  layout.file_offset = layout.range_gpa - layout.node0_bytes;  // Node 1 starts at node 0's end.
  if (layout.range_gpa + layout.range_bytes > low_limit) {
    return Error{"boot range " + HexText(layout.range_gpa) + "+" + HexText(range) +
                 " does not fit below the low-memory limit " + HexText(low_limit)};
  }
  return layout;
}

}  // namespace hvtrace::hostd
