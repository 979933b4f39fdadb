// Guest-physical RAM read straight out of QEMU's address space
// (process_vm_readv), for the reads a panic capture makes of the guest
// kernel (its log, VMCOREINFO): a QMP memsave costs a round trip, a file
// QEMU writes and one the daemon reads, ~1.3 ms each, and the kernel log
// took 5-9 of them (capture_latency.sh `ring`, 10-17 ms); here a read is a
// system call of a few microseconds.
//
// Where each RAM range sits in QEMU's memory is asked of QEMU once, when
// the VM is taken on (HMP `info mtree -f` for the ranges, `gpa2hva` for
// each one's host address), not at the panic. Only ranges of at least
// kMinGuestRamRange are kept: what lies below 1 MiB is remapped by the
// firmware (PAM, SMRAM) and the kernel reads nothing there.
//
// The bytes are the guest's, read while its vCPUs are stopped: callers
// treat them as hostile input like every other guest byte.
#ifndef HVTRACE_HOSTD_QEMU_GUEST_RAM_H_
#define HVTRACE_HOSTD_QEMU_GUEST_RAM_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

inline constexpr uint64_t kMinGuestRamRange = 1ull << 20;

struct GuestRamRange {
  uint64_t gpa = 0;
  uint64_t bytes = 0;
  uint64_t hva = 0;  // In QEMU's address space; 0 until gpa2hva answered.
};

// The RAM ranges (type "ram", at least |min_bytes|) of the flat view of the
// "memory" address space in HMP `info mtree -f`'s text; an error when that
// view or any RAM in it is missing.
Result<std::vector<GuestRamRange>> ParseRamFlatView(std::string_view text,
                                                    uint64_t min_bytes = kMinGuestRamRange);
// The host address in HMP `gpa2hva`'s answer ("Host virtual address for
// 0x… (name) is 0x…").
Result<uint64_t> ParseGpa2Hva(std::string_view text);

class GuestRam {
 public:
  // |ranges| with their hva set, of the QEMU process |pid|.
  GuestRam(pid_t pid, std::vector<GuestRamRange> ranges);

  pid_t pid() const { return pid_; }
  const std::vector<GuestRamRange>& ranges() const { return ranges_; }
  // Copies guest-physical [gpa, gpa + out.size()) into |out|: an error when
  // the span is not inside one range or QEMU's memory cannot be read.
  Status Read(uint64_t gpa, std::span<std::byte> out) const;
  // Reads |each| bytes at every one of |gpas| into consecutive slots of
  // |out| (|each| * gpas.size() bytes), in as few system calls as it can.
  // Returns how many of them, from the first, were read whole.
  size_t ReadEach(std::span<const uint64_t> gpas, size_t each, std::span<std::byte> out) const;

 private:
  const GuestRamRange* Find(uint64_t gpa, uint64_t bytes) const;

  pid_t pid_;
  std::vector<GuestRamRange> ranges_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_QEMU_GUEST_RAM_H_
