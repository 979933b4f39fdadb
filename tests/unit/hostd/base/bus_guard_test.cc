#include "bus_guard.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace hvtrace::hostd {
namespace {

// A file mapped two pages long, then cut to one: as QEMU (or a local user
// with its uid) could do to a region file under a capture.
class ShrunkMapping : public ::testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/bus_guard_testXXXXXX";
    fd_ = ::mkstemp(path);
    ASSERT_GE(fd_, 0);
    ::unlink(path);
    page_ = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    ASSERT_EQ(::ftruncate(fd_, static_cast<off_t>(2 * page_)), 0);
    void* map = ::mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    ASSERT_NE(map, MAP_FAILED);
    map_ = static_cast<char*>(map);
    std::memset(map_, 'x', 2 * page_);
    ASSERT_EQ(::ftruncate(fd_, static_cast<off_t>(page_)), 0);
  }
  void TearDown() override {
    if (map_ != nullptr) ::munmap(map_, 2 * page_);
    if (fd_ >= 0) ::close(fd_);
  }
  int fd_ = -1;
  size_t page_ = 0;
  char* map_ = nullptr;
};

TEST_F(ShrunkMapping, CopyPastTheNewEndFailsInsteadOfKilling) {
  std::vector<char> out(2 * page_, 0);
  EXPECT_FALSE(GuardedCopy(out.data(), map_, 2 * page_));
  // The guard is gone after a failure, and works again.
  EXPECT_FALSE(GuardedCopy(out.data(), map_ + page_, 16));
  EXPECT_TRUE(GuardedCopy(out.data(), map_, page_));
  EXPECT_EQ(std::string(out.data(), 4), "xxxx");
}

TEST_F(ShrunkMapping, SigbusOutsideAGuardStillKills) {
  char first[16];
  ASSERT_TRUE(GuardedCopy(first, map_, sizeof first));  // The handler is in place.
  EXPECT_EXIT(
      {
        volatile char c = map_[page_];
        (void)c;
        std::_Exit(0);
      },
      // Killed by SIGBUS, or, under ASan, by its SIGBUS report (exit 1): the
      // disposition from before the guard was installed.
      [](int status) {
        return (WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) ||
               (WIFEXITED(status) && WEXITSTATUS(status) != 0);
      },
      "");
}

}  // namespace
}  // namespace hvtrace::hostd
