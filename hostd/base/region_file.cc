#include "region_file.h"

#include <sys/mman.h>
#include <unistd.h>

namespace hvtrace::hostd {

std::shared_ptr<const RegionFile> RegionFile::Adopt(int fd, uint64_t offset, uint64_t size) {
  if (fd < 0) return nullptr;
  return std::shared_ptr<const RegionFile>(new RegionFile(fd, offset, size));
}

RegionFile::RegionFile(int fd, uint64_t offset, uint64_t size)
    : fd_(fd), offset_(offset), size_(size) {
  if (size == 0) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  skip_ = offset % page;
  map_length_ = skip_ + size;
  void* map =
      ::mmap(nullptr, map_length_, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset - skip_));
  if (map == MAP_FAILED) return;
  map_ = map;
  (void)::madvise(map_, map_length_, MADV_DONTFORK);
  // Fills the page tables now (Linux >= 5.14). Fails harmlessly for pages
  // past the file's end; those fault at the copy, as without it.
  (void)::madvise(map_, map_length_, MADV_POPULATE_READ);
}

RegionFile::~RegionFile() {
  if (map_ != nullptr) ::munmap(map_, map_length_);
  if (fd_ >= 0) ::close(fd_);
}

std::span<const std::byte> RegionFile::mapped(uint64_t offset, uint64_t size) const {
  if (map_ == nullptr || offset != offset_ || size != size_) return {};
  return {static_cast<const std::byte*>(map_) + skip_, size_};
}

}  // namespace hvtrace::hostd
