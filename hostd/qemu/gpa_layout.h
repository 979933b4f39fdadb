// Guest-physical layout of a host-backed boot range (DESIGN §4.2).
//
// The guest's RAM is split into two NUMA nodes. QEMU lays nodes out from GPA 0
// in order, and as long as all RAM sits below the machine's low-memory limit
// the layout is contiguous:
//
//   GPA 0                node0_bytes                       memory_bytes
//   |---- node 0 (anon RAM) ----|== range ==|-- headroom --|
//                               ^ node 1 = host file, offset 0 at node0_bytes
//
// The trace range sits at the start of node 1, so its GPA is node0_bytes and
// its host file offset is GPA - node-1 start. Node 1 must be larger than the
// range (a node that is all reserved gets no struct pages: "Failed to map boot
// instance"), and the top ~16 MiB of low RAM belong to SeaBIOS and -initrd, so
// node 1 keeps at least kBootRangeHeadroom bytes after the range.
#ifndef HVTRACE_HOSTD_GPA_LAYOUT_H_
#define HVTRACE_HOSTD_GPA_LAYOUT_H_

#include <cstdint>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

enum class MachineType { kPc, kQ35 };

inline constexpr uint64_t kMiB = 1ull << 20;
inline constexpr uint64_t kGuestPageSize = 4096;
// Node sizes are kept 2 MiB aligned so memory backends can use huge pages.
inline constexpr uint64_t kNodeAlignment = 2 * kMiB;
inline constexpr uint64_t kBootRangeHeadroom = 48 * kMiB;
// Below this node 0 cannot hold the kernel and its early allocations.
inline constexpr uint64_t kMinNode0Bytes = 128 * kMiB;

// Where QEMU 7.2 ends RAM below 4 GiB. pc: 3.5 GiB, or 3 GiB once RAM no longer
// fits (gigabyte_align); q35: 2.75 GiB, or 2 GiB once RAM no longer fits.
uint64_t LowMemoryLimit(MachineType machine, uint64_t memory_bytes);

struct BootRangeRequest {
  MachineType machine = MachineType::kPc;
  uint64_t memory_bytes = 0;  // Total guest RAM (-m).
  uint64_t range_bytes = 0;   // Size of the trace range.
  // Size of node 0, which is also the GPA of the range. 0 picks the smallest
  // node 1 that fits: range + headroom, rounded up to kNodeAlignment.
  uint64_t node0_bytes = 0;
};

struct BootRangeLayout {
  uint64_t node0_bytes = 0;
  uint64_t node1_bytes = 0;  // Also the size of the host backing file.
  uint64_t range_gpa = 0;
  uint64_t range_bytes = 0;
  uint64_t file_offset = 0;  // Offset of the range in the host file.
};

// Computes and checks the layout; errors say which limit was broken.
Result<BootRangeLayout> ComputeBootRangeLayout(const BootRangeRequest& request);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_GPA_LAYOUT_H_
