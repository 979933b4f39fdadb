// kernel.log's text, and the kernel log step's answer when guest memory
// cannot be read (the real reads: tests/e2e/postmortem_memory_e2e.cc).
#include "kernel_log_step.h"

#include <gtest/gtest.h>

#include <string>

#include "test_support.h"

namespace hvtrace::hostd {
namespace {

using test_support::TempDir;

TEST(KernelLogStepTest, TextHasSeqTimeCallerAndPrintableText) {
  KernelLog log;
  log.records.push_back({0, 0, -1, 0, -1, "Linux version 6.12"});
  log.records.push_back({7, 1234567890, 1, -1, -1, "from cpu\x1b[31m red"});
  EXPECT_EQ(KernelLogText(log),
            "0\t[    0.000000]\tT0\tLinux version 6.12\n"
            "7\t[    1.234567]\tC1\tfrom cpu\\x1b[31m red\n");
}

TEST(KernelLogStepTest, WithoutAReaderTheManifestSaysWhy) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "captures");
  auto pending = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(pending.ok());
  CaptureInputs in;
  CaptureManifest m;
  EXPECT_FALSE(ReadKernelLogStep(in, nullptr, **pending, m).has_value());
  EXPECT_NE(m.extra["kernel_log"]["error"].get<std::string>().find("cannot read guest memory"),
            std::string::npos);
  EXPECT_TRUE(m.extra["timing_ms"].contains("kernel_log"));
}

}  // namespace
}  // namespace hvtrace::hostd
