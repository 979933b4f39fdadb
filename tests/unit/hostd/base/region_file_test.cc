#include "region_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

// How many pages of |range| have a page table entry in this process
// (/proc/self/pagemap bit 63), looked at without touching them. (Counting
// the faults of a read instead also counts a sanitizer's shadow memory.)
uint64_t PresentPages(std::span<const std::byte> range) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t first = reinterpret_cast<uintptr_t>(range.data()) / page;
  const uint64_t count = (range.size() + page - 1) / page;
  std::vector<uint64_t> entries(count);
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  if (fd < 0) return 0;
  const ssize_t bytes = static_cast<ssize_t>(count * sizeof(uint64_t));
  EXPECT_EQ(::pread(fd, entries.data(), bytes, static_cast<off_t>(first * sizeof(uint64_t))),
            bytes);
  ::close(fd);
  uint64_t present = 0;
  for (uint64_t e : entries) present += e >> 63;
  return present;
}

// A file of |bytes| bytes, each page starting with its index, in /dev/shm
// (a tmpfs, where QEMU's memory files live on a host) when there is one.
fs::path MakeFile(uint64_t bytes) {
  const fs::path dir = fs::is_directory("/dev/shm") ? "/dev/shm" : fs::temp_directory_path();
  const fs::path path = dir / ("hvtrace-region-file-" + std::to_string(::getpid()));
  std::vector<char> data(bytes);
  for (uint64_t p = 0; p * 4096 < bytes; ++p) std::memcpy(&data[p * 4096], &p, sizeof(p));
  FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  if (f != nullptr) {
    EXPECT_EQ(std::fwrite(data.data(), 1, data.size(), f), data.size());
    std::fclose(f);
  }
  return path;
}

// The range is mapped with its page tables filled at Adopt, so reading it
// later takes no page fault (mapped at the copy, a tmpfs file took one per
// 16 pages).
TEST(RegionFileMapTest, KeptMappingHasItsPageTablesFilled) {
  constexpr uint64_t kBytes = 4u << 20, kOffset = 8192, kSize = kBytes - kOffset;
  const fs::path path = MakeFile(kBytes);
  auto file = RegionFile::Adopt(::open(path.c_str(), O_RDONLY | O_CLOEXEC), kOffset, kSize);
  fs::remove(path);  // The open file keeps the bytes.
  ASSERT_NE(file, nullptr);
  EXPECT_GE(file->fd(), 0);
  const std::span<const std::byte> range = file->mapped(kOffset, kSize);
  ASSERT_EQ(range.size(), kSize);
  EXPECT_TRUE(file->mapped(0, kSize).empty());  // Not the range it mapped.
  const uint64_t present = PresentPages(range);
  std::printf("%llu of %llu pages of the kept mapping have page table entries before any read\n",
              static_cast<unsigned long long>(present),
              static_cast<unsigned long long>(range.size() / 4096));
  EXPECT_EQ(present, (kSize + 4095) / 4096);
  std::vector<std::byte> copy(kSize);
  std::memcpy(copy.data(), range.data(), kSize);
  uint64_t page = 0;
  std::memcpy(&page, copy.data(), sizeof(page));
  EXPECT_EQ(page, kOffset / 4096);
}

// Holes are not filled (that would allocate them: a VM whose guest never
// writes its range would cost all of it); the data a guest writes later is,
// at the next Warm.
TEST(RegionFileMapTest, WarmFillsDataAndLeavesHoles) {
  constexpr uint64_t kBytes = 1u << 20;
  const fs::path path = MakeFile(0);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kBytes), 0);
  const std::vector<char> page(4096, 'x');
  ASSERT_EQ(::pwrite(fd, page.data(), page.size(), 0), 4096);
  struct stat before;
  ASSERT_EQ(::fstat(fd, &before), 0);
  auto file = RegionFile::Adopt(::dup(fd), 0, kBytes);
  ASSERT_NE(file, nullptr);
  struct stat after;
  ASSERT_EQ(::fstat(fd, &after), 0);
  EXPECT_EQ(after.st_blocks, before.st_blocks);  // No hole allocated.
  EXPECT_EQ(file->warm_bytes(), 4096u);
  // The guest writes the rest: the next Warm fills it all.
  for (uint64_t off = 4096; off < kBytes; off += 4096) {
    ASSERT_EQ(::pwrite(fd, page.data(), page.size(), static_cast<off_t>(off)), 4096);
  }
  EXPECT_EQ(PresentPages(file->mapped(0, kBytes)), 1u);  // Only the data page.
  file->Warm();
  EXPECT_EQ(file->warm_bytes(), kBytes);
  EXPECT_EQ(PresentPages(file->mapped(0, kBytes)), kBytes / 4096);
  std::vector<std::byte> copy(kBytes);
  std::memcpy(copy.data(), file->mapped(0, kBytes).data(), kBytes);
  EXPECT_EQ(copy[kBytes - 1], std::byte{'x'});
  ::close(fd);
  fs::remove(path);
}

TEST(RegionFileMapTest, NoDescriptorIsNoFile) {
  EXPECT_EQ(RegionFile::Adopt(-1, 0, 4096), nullptr);
}

}  // namespace
}  // namespace hvtrace::hostd
