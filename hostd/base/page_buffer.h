// Memory for a capture's copy of a guest range that fork() leaves alone.
//
// hvtraced forks (QEMU's launch, the isolated trial parse of formats). A
// fork write-protects every private page of the parent, so the next write
// to each takes a fault: a 16 MiB copy buffer reserved before a guest was
// booted cost 4,097 faults at that guest's panic, 6-7 ms of copying against
// 1.6-2.2 ms for the same copy into pages no fork had marked
// (bench/README.md, capture_latency `copy` and `cp.flt`). This buffer is a
// mapping of its own marked MADV_DONTFORK: children never see it, so its
// pages stay writable. No child may touch it (none does: QEMU execs, the
// trial parse reads formats only).
//
// A buffer of 2 MiB or more starts on a 2 MiB boundary and is marked
// MADV_HUGEPAGE: memory left untouched for a while is slow to touch again
// on a host that reclaims or re-maps idle guest memory per small page
// (nested virtualisation, free page reporting), and the buffer waits idle
// from the VM's registration to its panic. bench/idle_copy_bench, 16 MiB
// after 30 s idle on the CI machine kind (a Firecracker VM with free page
// reporting): 243-261 ms into small pages, 37-66 ms into this buffer, and
// 7-10 ms when QEMU's file is on a huge-page tmpfs too; warm, 4-6 ms.
#ifndef HVTRACE_HOSTD_BASE_PAGE_BUFFER_H_
#define HVTRACE_HOSTD_BASE_PAGE_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace hvtrace::hostd {

class PageBuffer {
 public:
  PageBuffer() = default;
  ~PageBuffer();
  PageBuffer(PageBuffer&& other) noexcept;
  PageBuffer& operator=(PageBuffer&& other) noexcept;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;

  // Makes the buffer |bytes| long. Growing past the capacity maps anew
  // (the old bytes are not kept) and touches every page now, so a later
  // copy takes no fault; shrinking keeps the capacity. False when the
  // memory cannot be had (the buffer is then empty).
  bool Resize(uint64_t bytes);

  uint64_t size() const { return size_; }
  uint64_t capacity() const { return capacity_; }
  std::span<std::byte> span() const { return {base_, size_}; }

 private:
  void Release();

  std::byte* base_ = nullptr;
  uint64_t size_ = 0, capacity_ = 0;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_BASE_PAGE_BUFFER_H_
