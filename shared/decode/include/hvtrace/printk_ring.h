// The guest kernel's printk ring buffer (kernel/printk/printk_ringbuffer.h,
// Linux 5.10+), read from guest memory the way makedumpfile and crash read
// it from a vmcore: everything located through the kernel's VMCOREINFO text,
// no debuginfo.
//
// VMCOREINFO (kernel/printk/printk.c log_buf_vmcoreinfo_setup()) gives:
//   SYMBOL(prb)=<hex>                 the address of `struct printk_ringbuffer *prb`
//   SIZE(printk_ringbuffer)=<dec>     and OFFSET(printk_ringbuffer.desc_ring|text_data_ring)
//   OFFSET(prb_desc_ring.count_bits|descs|infos|head_id|tail_id)
//   SIZE(prb_desc), OFFSET(prb_desc.state_var|text_blk_lpos)
//   OFFSET(prb_data_blk_lpos.begin|next)
//   SIZE(printk_info), OFFSET(printk_info.seq|ts_nsec|text_len|caller_id)
//   OFFSET(prb_data_ring.size_bits|data), OFFSET(atomic_long_t.counter)
//
// The ring: 2^count_bits descriptors (state_var: the top two bits are the
// state, the rest the record's id; index = id mod count), one printk_info
// per descriptor, and a data ring of 2^size_bits bytes holding each
// record's text as a block `unsigned long id; char text[]` between the
// logical positions begin and next (a block that would cross the end starts
// again at offset 0). Records are walked from tail_id to head_id; only
// committed and finalized ones whose state_var still carries their id are
// read.
//
// Everything read is guest data: VMCOREINFO's numbers, the ring's sizes and
// ids, every position and length are bounded (kMaxPrintk*) and checked
// against the copies actually read; a record that fails is counted in
// KernelLog::malformed and skipped, never trusted.
#ifndef HVTRACE_SHARED_DECODE_PRINTK_RING_H_
#define HVTRACE_SHARED_DECODE_PRINTK_RING_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/kernel_log.h"
#include "hvtrace/result.h"

namespace hvtrace {

// The kernel's VMCOREINFO is one page (VMCOREINFO_BYTES); a little more is
// allowed, never more than this.
inline constexpr size_t kMaxVmcoreinfoBytes = 16 << 10;
// Ring sizes accepted (Linux allows log_buf_len up to 2^31; a guest asking
// for more than this is not read): 2^22 descriptors, a 2^26-byte text ring.
inline constexpr unsigned kMaxPrintkCountBits = 22;
inline constexpr unsigned kMaxPrintkSizeBits = 26;
// Largest struct sizes accepted from VMCOREINFO (real ones: prb_desc 24,
// printk_info 88, printk_ringbuffer ~ 100-200).
inline constexpr uint64_t kMaxPrintkStructSize = 4096;

// VMCOREINFO's `KEY=VALUE` lines. Lines of any other shape are skipped.
class Vmcoreinfo {
 public:
  // |text| is cut at kMaxVmcoreinfoBytes and at its first NUL.
  static Vmcoreinfo Parse(std::string_view text);

  std::optional<std::string_view> Value(std::string_view key) const;
  std::optional<uint64_t> Symbol(std::string_view name) const;    // SYMBOL(name), hex.
  std::optional<uint64_t> Offset(std::string_view member) const;  // OFFSET(type.member), decimal.
  std::optional<uint64_t> Size(std::string_view type) const;      // SIZE(type), decimal.
  // NUMBER(name), signed decimal (the kernel prints them with %ld).
  std::optional<int64_t> Number(std::string_view name) const;
  size_t size() const { return values_.size(); }

 private:
  std::map<std::string, std::string, std::less<>> values_;
};

// Reads |size| bytes of guest virtual memory at |addr| (while the vCPUs are
// stopped). Anything it returns other than exactly |size| bytes is a failed
// read.
using GuestMemoryRead = std::function<Result<std::vector<std::byte>>(uint64_t addr, size_t size)>;

// What the reader found besides the records, for the manifest.
struct PrintkRingInfo {
  uint64_t ring = 0;        // Address of the printk_ringbuffer.
  uint32_t count_bits = 0;  // Descriptors: 2^count_bits.
  uint32_t size_bits = 0;   // Text ring: 2^size_bits bytes.
  uint64_t head_id = 0, tail_id = 0;
  uint64_t bytes_read = 0;  // Guest memory read, in all.
  uint64_t reads = 0;
};

// The log in the ring |info| describes, through |read|. Fails when the ring
// cannot be located or read as a whole (a missing VMCOREINFO entry, a size
// out of bounds, a read that fails); bad records only count as malformed.
// The result's source is "printk-ring"; lost is the first kept record's seq
// (records before it were overwritten: the ring wrapped).
Result<KernelLog> ReadPrintkRing(const Vmcoreinfo& info, const GuestMemoryRead& read,
                                 PrintkRingInfo* found = nullptr);

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_PRINTK_RING_H_
