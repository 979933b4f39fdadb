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

// AttachQemuTraceLogStep of a file holding |text| into a committed capture:
// its extra.host_trace and the qemu-trace.log it kept.
struct Attached {
  nlohmann::json host_trace;
  std::string kept;
};
Attached AttachAndCommit(const std::string& text, bool libvirt_log) {
  TempDir tmp;
  const auto log = tmp.path() / "qemu-trace.log";
  Write(log, text);
  CaptureStore store(tmp.path() / "captures");
  auto pending = store.Begin("panic", HostTime::Now());
  EXPECT_TRUE(pending.ok()) << pending.error().message;
  if (!pending.ok()) return {};
  CaptureManifest manifest;
  manifest.vm = "g1";
  manifest.trigger = "panic";
  AttachQemuTraceLogStep(log, **pending, manifest, libvirt_log);
  Attached out{manifest.extra["host_trace"], ""};
  auto entry = (*pending)->Commit(std::move(manifest));
  EXPECT_TRUE(entry.ok()) << entry.error().message;
  if (entry.ok()) out.kept = Read(entry->dir / "qemu-trace.log");
  return out;
}

TEST(HostTraceCaptureTest, CopiesLogAndSummarises) {
  const Attached a = AttachAndCommit(kLines + "garbage\n", false);
  const nlohmann::json& h = a.host_trace;
  EXPECT_EQ(h["file"], "qemu-trace.log");
  EXPECT_EQ(h["events"], 3);
  EXPECT_EQ(h["malformed"], 1);
  EXPECT_EQ(h["by_name"]["virtio_set_status"], 2);
  EXPECT_EQ(h["by_name"]["fw_cfg_read"], 1);
  EXPECT_EQ(h["first_realtime_ns"], 100000001000ull);
  EXPECT_EQ(h["last_realtime_ns"], 100000003000ull);
  EXPECT_EQ(h["skipped_head_bytes"], 0);
  EXPECT_EQ(h["first_problem"], "line 4: no TID@ prefix (not a `-msg timestamp=on` trace line)");
  EXPECT_EQ(a.kept, kLines + "garbage\n");
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

// libvirt's log of a domain as virtlogd keeps it across two starts (the
// lines' shapes from libvirt 9.0 and QEMU 7.2 with `-msg timestamp=on`).
const std::string kLibvirtLog =
    "2026-11-29 04:00:01.100+0000: starting up libvirt version: 9.0.0, qemu version: 7.2.19\n"
    "LC_ALL=C PATH=/usr/bin /usr/bin/qemu-system-x86_64 -name guest=d -trace enable=x\n"
    "9@90.000001:virtio_set_status vdev 0x1 val 15\n"
    "2026-11-29 04:00:09.000+0000: shutting down, reason=destroyed\n"
    "2026-11-29 04:01:01.100+0000: starting up libvirt version: 9.0.0, qemu version: 7.2.19\n"
    "LC_ALL=C PATH=/usr/bin /usr/bin/qemu-system-x86_64 -name guest=d -trace enable=x\n"
    "char device redirected to /dev/pts/3 (label charserial0)\n" +
    kLines + "2026-11-29T04:01:05.123456Z qemu-system-x86_64: terminating on signal 15\n";

TEST(HostTraceCaptureTest, LibvirtLogKeepsTheNewestStartsTraceLines) {
  const LibvirtLogTrace kept = TraceLinesOfNewestStart(kLibvirtLog);
  EXPECT_TRUE(kept.start_found);
  EXPECT_EQ(kept.text, kLines);
  EXPECT_EQ(kept.other_lines, 3u);
  EXPECT_EQ(kLibvirtLog.substr(kept.earlier_bytes, 7), "LC_ALL=");
  // No start line in what was read (a tail past it): all trace lines count.
  const LibvirtLogTrace no_start = TraceLinesOfNewestStart(kLines + "9@1.000000:x\n");
  EXPECT_FALSE(no_start.start_found);
  EXPECT_EQ(no_start.text, kLines + "9@1.000000:x\n");
}

// QEMU's stderr is in the same file, and a guest can make QEMU print text
// (device emulation messages): a "starting up" inside such a line is not a
// start, and what passes as a trace line still goes through the parser.
TEST(HostTraceCaptureTest, Malicious_LibvirtLogLinesFromQemu) {
  const std::string log = kLibvirtLog +
                          "2026-11-29T04:01:06.000000Z qemu: x: starting up libvirt version: 1\n"
                          "12@notatime:virtio_set_status vdev 0x1 val 3\n" +
                          std::string(10000, 'A') + "\n1@";
  const LibvirtLogTrace kept = TraceLinesOfNewestStart(log);
  EXPECT_EQ(kept.text, kLines + "12@notatime:virtio_set_status vdev 0x1 val 3\n1@");
  const QemuTraceLog parsed = ParseQemuTraceLog(kept.text);
  EXPECT_EQ(parsed.events.size(), 3u);
  EXPECT_EQ(parsed.malformed_lines, 2u);
}

TEST(HostTraceCaptureTest, AttachesTheLibvirtLogsNewestStart) {
  const Attached a = AttachAndCommit(kLibvirtLog, /*libvirt_log=*/true);
  const nlohmann::json& h = a.host_trace;
  EXPECT_EQ(h["events"], 3);
  EXPECT_EQ(h["malformed"], 0);
  EXPECT_EQ(h["libvirt_log"]["other_lines"], 3);
  EXPECT_EQ(h["libvirt_log"]["newest_start_found"], true);
  EXPECT_EQ(a.kept, kLines);
}

}  // namespace
}  // namespace hvtrace::hostd
