#include "host_trace_capture.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.h"

namespace hvtrace::hostd {
namespace {

using test_support::TempDir;

void Write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string Read(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const std::string kLines =
    "10@100.000001:virtio_set_status vdev 0x1 val 0\n"
    "10@100.000002:fw_cfg_read 0x5 = 0x51\n"
    "11@100.000003:virtio_set_status vdev 0x1 val 15\n";

TEST(HostTraceCaptureTest, CopiesLogAndSummarises) {
  TempDir tmp;
  const auto log = tmp.path() / "qemu-trace.log";
  Write(log, kLines + "garbage\n");
  CaptureStore store(tmp.path() / "captures");
  auto pending = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(pending.ok()) << pending.error().message;
  CaptureManifest manifest;
  manifest.vm = "g1";
  manifest.trigger = "panic";
  AttachQemuTraceLogStep(log, **pending, manifest);
  const nlohmann::json& h = manifest.extra["host_trace"];
  EXPECT_EQ(h["file"], "qemu-trace.log");
  EXPECT_EQ(h["events"], 3);
  EXPECT_EQ(h["malformed"], 1);
  EXPECT_EQ(h["by_name"]["virtio_set_status"], 2);
  EXPECT_EQ(h["by_name"]["fw_cfg_read"], 1);
  EXPECT_EQ(h["first_realtime_ns"], 100000001000ull);
  EXPECT_EQ(h["last_realtime_ns"], 100000003000ull);
  EXPECT_EQ(h["skipped_head_bytes"], 0);
  EXPECT_EQ(h["first_problem"], "line 4: no TID@ prefix (not a `-msg timestamp=on` trace line)");
  auto entry = (*pending)->Commit(std::move(manifest));
  ASSERT_TRUE(entry.ok()) << entry.error().message;
  EXPECT_EQ(Read(entry->dir / "qemu-trace.log"), kLines + "garbage\n");
}

TEST(HostTraceCaptureTest, KeepsNewestBytesFromALineStart) {
  TempDir tmp;
  const auto log = tmp.path() / "qemu-trace.log";
  Write(log, kLines);
  // 60 bytes from the end cut the second line: it is left out.
  auto copy = ReadQemuTraceLogTail(log, 60);
  ASSERT_TRUE(copy.ok()) << copy.error().message;
  EXPECT_EQ(copy->text, "11@100.000003:virtio_set_status vdev 0x1 val 15\n");
  EXPECT_EQ(copy->file_bytes, kLines.size());
  EXPECT_EQ(copy->skipped_head_bytes, kLines.size() - copy->text.size());
  // A cut exactly at a line start keeps that line.
  const size_t last = std::string("11@100.000003:virtio_set_status vdev 0x1 val 15\n").size();
  auto exact = ReadQemuTraceLogTail(log, last);
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->text.size(), last);
}

TEST(HostTraceCaptureTest, Malicious_SymlinkAndMissingAreRecordedNotFollowed) {
  TempDir tmp;
  const auto secret = tmp.path() / "secret";
  Write(secret, "1@1.000001:x\n");
  const auto log = tmp.path() / "qemu-trace.log";
  std::filesystem::create_symlink(secret, log);
  EXPECT_FALSE(ReadQemuTraceLogTail(log).ok());
  EXPECT_FALSE(ReadQemuTraceLogTail(tmp.path() / "none").ok());
  ASSERT_EQ(::mkfifo((tmp.path() / "fifo").c_str(), 0600), 0);
  auto fifo = ReadQemuTraceLogTail(tmp.path() / "fifo");
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.error().message.find("not a regular file"), std::string::npos);

  CaptureStore store(tmp.path() / "captures");
  auto pending = store.Begin("manual", HostTime::Now());
  ASSERT_TRUE(pending.ok());
  CaptureManifest manifest;
  AttachQemuTraceLogStep(log, **pending, manifest);
  EXPECT_TRUE(manifest.extra["host_trace"].contains("error"));
  EXPECT_FALSE(manifest.extra["host_trace"].contains("file"));
  EXPECT_FALSE(std::filesystem::exists((*pending)->dir() / "qemu-trace.log"));
}

TEST(HostTraceCaptureTest, Malicious_ManyNamesAreCapped) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += "1@1.000001:ev" + std::to_string(i) + "\n";
  HostTraceCopy copy{text, text.size(), 0};
  nlohmann::json j = HostTraceSummary(ParseQemuTraceLog(text), copy);
  EXPECT_EQ(j["by_name"].size(), kHostTraceMaxNames + 1);
  EXPECT_EQ(j["by_name"]["(other)"], 100 - kHostTraceMaxNames);
}

}  // namespace
}  // namespace hvtrace::hostd
