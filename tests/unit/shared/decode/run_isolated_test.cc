#include "hvtrace/run_isolated.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>

namespace hvtrace {
namespace {

using ::testing::HasSubstr;

TEST(RunIsolatedTest, ReportsWhatTheChildDid) {
  int touched = 0;
  EXPECT_EQ(RunIsolated([&] { touched = 1; }, 5), "");
  EXPECT_EQ(touched, 0);  // The child wrote its own copy.
  EXPECT_THAT(RunIsolated([] { std::raise(SIGSEGV); }, 5), HasSubstr("killed by signal 11"));
  EXPECT_THAT(RunIsolated([] { _exit(3); }, 5), HasSubstr("exited with status 3"));
  EXPECT_THAT(RunIsolated(
                  [] {
                    for (;;) pause();
                  },
                  1),
              HasSubstr("timed out after 1 s"));
}

}  // namespace
}  // namespace hvtrace
