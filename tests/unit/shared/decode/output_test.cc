#include "hvtrace/output.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

namespace hvtrace {
namespace {

// |fd|'s whole content.
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

class OutputSinkModes : public testing::TestWithParam<OutputSink::Mode> {};

// Many small flushes (a 64-byte flush size), appends and large writes mixed:
// the file holds them all in order, in either mode.
TEST_P(OutputSinkModes, WritesEverythingInOrder) {
  const int fd = ::memfd_create("sink", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::string expected;
  {
    OutputSink sink(fd, 64, GetParam());
    for (int i = 0; i < 2000; ++i) {
      const std::string line = "line " + std::to_string(i) + "\n";
      sink.buffer()->append(line);
      sink.MaybeFlush();
      expected += line;
      if (i % 100 == 0) {
        const std::string big(300, static_cast<char>('a' + i % 26));
        sink.Write(big);
        expected += big;
      }
    }
    ASSERT_TRUE(sink.Flush().ok());
    EXPECT_EQ(ReadAll(fd), expected);
    sink.buffer()->append("tail");  // Written by the destructor.
    expected += "tail";
  }
  EXPECT_EQ(ReadAll(fd), expected);
  ::close(fd);
}

TEST_P(OutputSinkModes, AWriteErrorIsKept) {
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // write(2) fails: EBADF.
  ASSERT_GE(fd, 0);
  OutputSink sink(fd, 16, GetParam());
  sink.buffer()->append("more than sixteen bytes");
  sink.MaybeFlush();
  const Status s = sink.Flush();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("write to output failed"), std::string::npos);
  EXPECT_FALSE(sink.status().ok());
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Modes, OutputSinkModes,
                         testing::Values(OutputSink::Mode::kInline, OutputSink::Mode::kBackground));

}  // namespace
}  // namespace hvtrace
