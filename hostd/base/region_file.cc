#include "region_file.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

namespace hvtrace::hostd {

std::shared_ptr<const RegionFile> RegionFile::Adopt(int fd, uint64_t offset, uint64_t size) {
  if (fd < 0) return nullptr;
  std::shared_ptr<const RegionFile> file(new RegionFile(fd, offset, size));
  file->Warm();
  return file;
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
}

RegionFile::~RegionFile() {
  if (map_ != nullptr) ::munmap(map_, map_length_);
  if (fd_ >= 0) ::close(fd_);
}

std::span<const std::byte> RegionFile::mapped(uint64_t offset, uint64_t size) const {
  if (map_ == nullptr || offset != offset_ || size != size_) return {};
  return {static_cast<const std::byte*>(map_) + skip_, size_};
}

void RegionFile::Warm() const {
  if (map_ == nullptr || warm_bytes() >= size_) return;
  std::lock_guard lock(warm_mu_);
  // The data extents of the range, in file offsets (a file system without
  // SEEK_DATA reports the whole file as data).
  struct Extent {
    uint64_t from, to;
  };
  std::vector<Extent> data;
  uint64_t data_bytes = 0;
  const uint64_t end = offset_ + size_;
  for (uint64_t at = offset_; at < end;) {
    const off_t from = ::lseek(fd_, static_cast<off_t>(at), SEEK_DATA);
    if (from < 0 || static_cast<uint64_t>(from) >= end) break;  // ENXIO: no more data.
    const off_t hole = ::lseek(fd_, from, SEEK_HOLE);
    const uint64_t to = hole < 0 ? end : std::min<uint64_t>(static_cast<uint64_t>(hole), end);
    if (to <= static_cast<uint64_t>(from)) break;
    data.push_back({static_cast<uint64_t>(from), to});
    data_bytes += to - static_cast<uint64_t>(from);
    at = to;
  }
  // Nothing new since the last fill: the tables are as full as they get.
  if (data_bytes == 0 || data_bytes == warm_bytes()) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t map_file_start = offset_ - skip_;
  for (const Extent& e : data) {
    // Whole pages of the mapping covering the extent (Linux >= 5.14; an
    // older kernel says EINVAL and the copy faults them in instead).
    const uint64_t lo = (e.from - map_file_start) / page * page;
    const uint64_t hi = std::min(map_length_, (e.to - map_file_start + page - 1) / page * page);
    (void)::madvise(static_cast<std::byte*>(map_) + lo, hi - lo, MADV_POPULATE_READ);
  }
  warm_bytes_.store(data_bytes, std::memory_order_relaxed);
}

}  // namespace hvtrace::hostd
