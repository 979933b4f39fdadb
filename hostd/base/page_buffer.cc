#include "page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>

namespace hvtrace::hostd {

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
  void* map = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return false;
  // Without it the buffer still works; only the first copy after a fork
  // pays the faults again.
  (void)::madvise(map, length, MADV_DONTFORK);
  base_ = static_cast<std::byte*>(map);
  capacity_ = length;
  size_ = bytes;
  std::memset(base_, 0, length);  // Every page faulted in now, not at panic time.
  return true;
}

}  // namespace hvtrace::hostd
