#include "page_buffer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace hvtrace::hostd {
namespace {

long MinorFaults() {
  struct rusage ru;
  ::getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

TEST(PageBufferTest, GrowsZeroedShrinksWithoutLosingCapacity) {
  PageBuffer b;
  EXPECT_EQ(b.size(), 0u);
  ASSERT_TRUE(b.Resize(10000));
  EXPECT_EQ(b.size(), 10000u);
  EXPECT_GE(b.capacity(), 10000u);
  EXPECT_TRUE(
      std::all_of(b.span().begin(), b.span().end(), [](std::byte x) { return x == std::byte{0}; }));
  b.span()[9999] = std::byte{7};
  const uint64_t capacity = b.capacity();
  ASSERT_TRUE(b.Resize(100));
  EXPECT_EQ(b.size(), 100u);
  EXPECT_EQ(b.capacity(), capacity);
  ASSERT_TRUE(b.Resize(10000));  // Within the capacity: the same memory.
  EXPECT_EQ(b.span()[9999], std::byte{7});
  PageBuffer moved = std::move(b);
  EXPECT_EQ(moved.size(), 10000u);
  EXPECT_EQ(b.size(), 0u);  // NOLINT(bugprone-use-after-move): the moved-from state is empty.
}

// Why it exists: after a fork (hvtraced launches QEMU that way), writing
// into the buffer takes no fault; a plain heap buffer takes one per page.
TEST(PageBufferTest, AForkLeavesItsPagesWritable) {
  constexpr uint64_t kBytes = 4u << 20;
  PageBuffer b;
  ASSERT_TRUE(b.Resize(kBytes));
  std::vector<std::byte> plain(kBytes, std::byte{1});
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  long before = MinorFaults();
  std::fill(plain.begin(), plain.end(), std::byte{2});
  const long plain_faults = MinorFaults() - before;
  before = MinorFaults();
  std::fill(b.span().begin(), b.span().end(), std::byte{2});
  const long buffer_faults = MinorFaults() - before;
  std::printf("4 MiB written after a fork: %ld faults in a heap buffer, %ld in a PageBuffer\n",
              plain_faults, buffer_faults);
  EXPECT_LT(buffer_faults, 8);
  EXPECT_EQ(b.span()[kBytes - 1], std::byte{2});
}

// A buffer of 2 MiB or more starts on a 2 MiB boundary (where a huge page can
// back it) and its whole length is usable; a small one is left as it was.
TEST(PageBufferTest, ALargeBufferStartsOnAHugePageBoundary) {
  constexpr uint64_t kHuge = 2u << 20;
  for (const uint64_t bytes : {kHuge, 16u * kHuge + 4096, uint64_t{5000}}) {
    PageBuffer b;
    ASSERT_TRUE(b.Resize(bytes));
    const auto at = reinterpret_cast<uintptr_t>(b.span().data());
    if (bytes >= kHuge) {
      EXPECT_EQ(at % kHuge, 0u) << bytes;
    }
    std::fill(b.span().begin(), b.span().end(), std::byte{3});
    EXPECT_EQ(b.span()[bytes - 1], std::byte{3});
  }
}

}  // namespace
}  // namespace hvtrace::hostd
