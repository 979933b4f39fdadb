#include "page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>

namespace hvtrace::hostd {
namespace {

// x86-64's transparent huge page (PMD) size.
constexpr uint64_t kHugePage = uint64_t{2} << 20;

}  // namespace

PageBuffer::~PageBuffer() { Release(); }

PageBuffer::PageBuffer(PageBuffer&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)) {}

PageBuffer& PageBuffer::operator=(PageBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void PageBuffer::Release() {
  if (base_ != nullptr) ::munmap(base_, capacity_);
  base_ = nullptr;
  size_ = capacity_ = 0;
}

bool PageBuffer::Resize(uint64_t bytes) {
  if (bytes <= capacity_) {
    size_ = bytes;
    return true;
  }
  Release();
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t length = (bytes + page - 1) / page * page;
  // Reserved with room to start on a huge-page boundary; the rest is given
  // back at once.
  const uint64_t slack = length >= kHugePage ? kHugePage : 0;
  void* map =
      ::mmap(nullptr, length + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return false;
  auto* raw = static_cast<std::byte*>(map);
  std::byte* start = raw;
  if (slack != 0) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(raw);
    start = raw + ((kHugePage - at % kHugePage) % kHugePage);
    if (start > raw) ::munmap(raw, static_cast<size_t>(start - raw));
    if (std::byte* end = start + length; end < raw + length + slack) {
      ::munmap(end, static_cast<size_t>(raw + length + slack - end));
    }
    // Where transparent huge pages are off this is refused and the buffer
    // is made of small pages, as before.
    (void)::madvise(start, length, MADV_HUGEPAGE);
  }
  // Without it the buffer still works; only the first copy after a fork
  // pays the faults again.
  (void)::madvise(start, length, MADV_DONTFORK);
  base_ = start;
  capacity_ = length;
  size_ = bytes;
  std::memset(base_, 0, length);  // Every page faulted in now, not at panic time.
  return true;
}

}  // namespace hvtrace::hostd
