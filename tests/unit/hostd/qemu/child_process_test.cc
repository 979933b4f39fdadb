#include "child_process.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>

namespace hvtrace::hostd {
namespace {

using namespace std::chrono_literals;

TEST(ChildProcessTest, CapturesStdoutAndStderrAndTheExitStatus) {
  ChildOutput out = RunChildCapture({"sh", "-c", "echo out; echo err >&2; exit 3"}, 4096, 20s);
  ASSERT_TRUE(out.spawned) << out.error;
  EXPECT_EQ(out.out, "out\nerr\n");
  EXPECT_FALSE(out.truncated);
  EXPECT_FALSE(out.timed_out);
  ASSERT_TRUE(WIFEXITED(out.wait_status));
  EXPECT_EQ(WEXITSTATUS(out.wait_status), 3);
}

// A child that prints without end is cut at the cap and still runs to its
// end (its output drained), so it never blocks on a full pipe.
TEST(ChildProcessTest, OutputBeyondTheCapIsDroppedAndCounted) {
  ChildOutput out = RunChildCapture({"head", "-c", "1000000", "/dev/zero"}, 100, 20s);
  ASSERT_TRUE(out.spawned) << out.error;
  EXPECT_EQ(out.out.size(), 100u);
  EXPECT_TRUE(out.truncated);
  EXPECT_TRUE(WIFEXITED(out.wait_status) && WEXITSTATUS(out.wait_status) == 0);
}

TEST(ChildProcessTest, AChildPastTheDeadlineIsKilledAndReaped) {
  ChildOutput out = RunChildCapture({"sleep", "60"}, 100, 100ms);
  ASSERT_TRUE(out.spawned) << out.error;
  EXPECT_TRUE(out.timed_out);
  ASSERT_TRUE(WIFSIGNALED(out.wait_status));
  EXPECT_EQ(WTERMSIG(out.wait_status), SIGKILL);
}

TEST(ChildProcessTest, AProgramThatDoesNotExistExitsWith127) {
  ChildOutput out = RunChildCapture({"/nonexistent/program"}, 100, 20s);
  ASSERT_TRUE(out.spawned) << out.error;
  EXPECT_TRUE(WIFEXITED(out.wait_status) && WEXITSTATUS(out.wait_status) == 127);
}

}  // namespace
}  // namespace hvtrace::hostd
