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

TEST(IsolatedWorkerTest, OneChildServesRequestsUntilItCrashes) {
  int counter = 0;  // Counts in the child's copy only.
  IsolatedWorker worker(
      [&](uint32_t request) {
        ++counter;
        if (request == 1 && counter != 2) _exit(10 + counter);  // The 2nd request in one child.
        if (request == 2) std::raise(SIGSEGV);
        if (request == 3 && counter != 1) _exit(20 + counter);  // The 1st in a fresh child.
      },
      5);
  EXPECT_EQ(worker.Run(0), "");
  EXPECT_EQ(worker.Run(1), "");  // Same child: it remembers the first request.
  EXPECT_THAT(worker.Run(2), HasSubstr("killed by signal 11"));
  EXPECT_EQ(worker.Run(3), "");  // A new child, forked from our memory.
  EXPECT_EQ(counter, 0);
  worker.End();
  EXPECT_EQ(worker.Run(3), "");  // End() ended the child; the next Run starts one.
}

}  // namespace
}  // namespace hvtrace
