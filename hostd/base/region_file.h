// An open host file holding a guest-physical range (a boot range's memory
// file), with the range mapped read-only and its page tables filled ahead
// of a panic, so the panic's copy takes no page faults.
//
// Mapping the range afresh at each capture cost the copy one fault per 16
// pages on a tmpfs (257 for 16 MiB) and took it from ~1.6 ms to ~3 ms; filling
// the tables at the capture (MAP_POPULATE, MADV_POPULATE_READ) costs as much
// (bench/README.md, "Panic to capture"). Only pages that hold data are
// filled (SEEK_DATA): filling a hole would allocate it, and a VM whose guest
// never writes its range (paused, or a kernel without a boot instance)
// would cost its whole range. The guest writes its range while it boots,
// after the VM registered, so Warm() is called again now and then until the
// whole range is data. Kept filled, the mapping costs page tables, 2 KiB per
// MiB of range; the pages are the guest's memory, shared with QEMU
// (RssShmem/RssFile of hvtraced, not its own). MADV_DONTFORK: no child sees
// the mapping.
#ifndef HVTRACE_HOSTD_BASE_REGION_FILE_H_
#define HVTRACE_HOSTD_BASE_REGION_FILE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>

namespace hvtrace::hostd {

class RegionFile {
 public:
  // Takes |fd| (closed with this object), maps [offset, offset + size) of
  // it and warms it (Warm). A file that cannot be mapped is still usable
  // through fd(); a range past the file's end is mapped and raises SIGBUS
  // until the file grows (readers copy with GuardedCopy). Null when fd < 0.
  static std::shared_ptr<const RegionFile> Adopt(int fd, uint64_t offset, uint64_t size);

  ~RegionFile();
  RegionFile(const RegionFile&) = delete;
  RegionFile& operator=(const RegionFile&) = delete;

  int fd() const { return fd_; }
  // The range [offset, offset + size) as mapped at Adopt; empty when it
  // could not be mapped or is not the range Adopt mapped.
  std::span<const std::byte> mapped(uint64_t offset, uint64_t size) const;

  // Fills the page tables of the range's data not filled yet. Cheap once
  // the whole range was filled (returns at once) or when no data was added
  // since the last call (a few lseeks). Any thread.
  void Warm() const;
  // Bytes of the range whose page tables Warm filled.
  uint64_t warm_bytes() const { return warm_bytes_.load(std::memory_order_relaxed); }

 private:
  RegionFile(int fd, uint64_t offset, uint64_t size);
  int fd_ = -1;
  uint64_t offset_ = 0, size_ = 0;
  void* map_ = nullptr;  // At the page holding offset_.
  uint64_t map_length_ = 0, skip_ = 0;
  mutable std::mutex warm_mu_;
  mutable std::atomic<uint64_t> warm_bytes_{0};
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_BASE_REGION_FILE_H_
