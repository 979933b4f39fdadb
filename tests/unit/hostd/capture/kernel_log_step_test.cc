// kernel.log's text, and the kernel log step's answer when guest memory
// cannot be read (the real reads: tests/e2e/postmortem_memory_e2e.cc).
#include "kernel_log_step.h"

#include <gtest/gtest.h>

#include <boost/asio/thread_pool.hpp>
#include <string>

#include "formats_service.h"
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

// A kernel the formats service has no entry for (its harvest failed; the
// boots decoded with the meta channel's formats): Get answers null, and the
// step says so instead of reading through it (hvtraced died of this in
// MetaChannelE2e's kexec-then-panic).
TEST(KernelLogStepTest, AKernelWithoutCachedFormatsIsSaidInTheManifest) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "captures");
  auto pending = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(pending.ok());
  boost::asio::thread_pool pool(1);
  FormatsService formats(tmp.path() / "formats", pool.get_executor(),
                         [](LogLevel, const std::string&) {});
  CaptureInputs in;
  in.region_file = RegionFileSource{};
  in.region_file->kernel_key = std::string(64, 'a');
  bool read = false;
  in.read_guest_memory = [&](uint64_t, size_t) -> Result<std::vector<std::byte>> {
    read = true;
    return Error{"not reached"};
  };
  CaptureManifest m;
  EXPECT_FALSE(ReadKernelLogStep(in, &formats, **pending, m).has_value());
  EXPECT_FALSE(read);
  EXPECT_NE(m.extra["kernel_log"]["error"].get<std::string>().find("formats are missing"),
            std::string::npos)
      << m.extra.dump();
  pool.join();
}

}  // namespace
}  // namespace hvtrace::hostd
