// Hand-corrupted copies of the real boot_map fixture region: every problem
// reported per CPU, the rest decoded, and each trace.dat holds exactly the
// records kept.
#include "capture_pipeline.h"
#include "hostd/decode/capture_pipeline_fixture.h"

namespace hvtrace::hostd {
namespace {

// Hand-corrupted copies of the real region: every problem reported per CPU,
// the rest decoded, and each trace.dat holds exactly the records kept.
// This file's own suite name: the unit tests of hostd/ share one
// executable, and GoogleTest refuses one suite name for fixtures of
// different translation units.
using CapturePipelineMaliciousTest = CapturePipelineTest;

TEST_F(CapturePipelineMaliciousTest, Malicious_BadMagicOnOneCpu) {
  Put32(kCpu1, 0xdeadbeef);
  Captured c = Capture(range_, formats_);
  ASSERT_FALSE(c.dir.empty());
  EXPECT_TRUE(HasIssue(c.manifest, 1, "magic"));
  EXPECT_EQ(c.manifest["validation"]["per_cpu"][1]["meta_found"], false);
  EXPECT_EQ(c.manifest["cpus"][1]["events"], 0);
  EXPECT_GT(c.manifest["cpus"][0]["events"].get<uint64_t>(), 1000u);
  EXPECT_EQ(TraceCmdCounts(c.dir / "boot-0.trace.dat"), ResultCounts(c.result));
}

TEST_F(CapturePipelineMaliciousTest, Malicious_IndexesOutOfRange) {
  Put32(kBuffers + 4 * 3, 99999);
  Put32(kBuffers + 4 * 7, static_cast<uint32_t>(-5));
  Captured c = Capture(range_, formats_);
  ASSERT_FALSE(c.dir.empty());
  EXPECT_TRUE(HasIssue(c.manifest, 0, "index_out_of_range"));
  EXPECT_EQ(c.manifest["validation"]["per_cpu"][0]["meta_valid"], false);
  EXPECT_GT(c.result.events, 30000u);
  EXPECT_EQ(TraceCmdCounts(c.dir / "boot-0.trace.dat"), ResultCounts(c.result));
}

TEST_F(CapturePipelineMaliciousTest, Malicious_DuplicateIndex) {
  int32_t slot;
  std::memcpy(&slot, range_.data() + kCpu1 + kBuffers + 4 * 2, 4);
  Put32(kCpu1 + kBuffers + 4 * 4, static_cast<uint32_t>(slot));
  Captured c = Capture(range_, formats_);
  ASSERT_FALSE(c.dir.empty());
  EXPECT_TRUE(HasIssue(c.manifest, 1, "duplicate_index"));
  EXPECT_EQ(BadPages(c.manifest, 1, "duplicate_slot"), 1u);
  EXPECT_EQ(c.manifest["totals"]["bad_pages"], 1);
  EXPECT_EQ(TraceCmdCounts(c.dir / "boot-0.trace.dat"), ResultCounts(c.result));
}

TEST_F(CapturePipelineMaliciousTest, Malicious_CommitPastThePage) {
  auto clean = ReadBootMap(range_, {0, *PageLayout::FromHeaderPage(formats_.header_page, 4096)});
  ASSERT_TRUE(clean.ok());
  const BootMapPage victim = clean->cpu[0].pages[5];
  Put64(victim.offset + 8, 5000);
  Captured c = Capture(range_, formats_);
  ASSERT_FALSE(c.dir.empty());
  EXPECT_TRUE(HasIssue(c.manifest, 0, "bad_page"));
  EXPECT_EQ(BadPages(c.manifest, 0, "commit_past_end"), 1u);
  EXPECT_EQ(c.result.events, clean->total_records() - victim.records);
  EXPECT_EQ(TraceCmdCounts(c.dir / "boot-0.trace.dat"), ResultCounts(c.result));
  // Where the bad page's events went missing, trace-cmd says so (the page
  // after it carries the missed-events flag), and the manifest counts it.
  const CmdRun report =
      RunCommand("trace-cmd report -i '" + (c.dir / "boot-0.trace.dat").string() + "'");
  EXPECT_NE(report.out.find("CPU:0 [EVENTS DROPPED]"), std::string::npos);
  EXPECT_EQ(c.manifest["cpus"][0].value("lost_marked_pages", 0), 1) << c.manifest["cpus"].dump();
}

TEST_F(CapturePipelineMaliciousTest, Malicious_TimeGoingBackwards) {
  auto clean = ReadBootMap(range_, {0, *PageLayout::FromHeaderPage(formats_.header_page, 4096)});
  ASSERT_TRUE(clean.ok());
  const BootMapPage victim = clean->cpu[1].pages[6];
  Put64(victim.offset, 1000);
  Captured c = Capture(range_, formats_);
  ASSERT_FALSE(c.dir.empty());
  EXPECT_TRUE(HasIssue(c.manifest, 1, "time_went_backwards"));
  EXPECT_EQ(BadPages(c.manifest, 1, "time_went_backwards"), 1u);
  EXPECT_EQ(c.result.boots.size(), 1u);
  EXPECT_EQ(c.result.events, clean->total_records() - victim.records);
  EXPECT_EQ(TraceCmdCounts(c.dir / "boot-0.trace.dat"), ResultCounts(c.result));
}

// A record in the middle of a page claims more bytes than the page holds: the
// records before it are kept, and trace-cmd sees exactly those (the page is
// written with its commit cut at the bad record).
TEST_F(CapturePipelineMaliciousTest, Malicious_RecordPastCommitKeepsTheGoodPrefix) {
  const PageLayout layout = *PageLayout::FromHeaderPage(formats_.header_page, 4096);
  auto clean = ReadBootMap(range_, {0, layout});
  ASSERT_TRUE(clean.ok());
  const BootMapPage victim = clean->cpu[0].pages[4];
  ASSERT_GT(victim.records, 10u);
  PageCursor cursor(std::span<const std::byte>(range_).subspan(victim.offset, 4096), layout);
  RawRecord rec;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(cursor.Next(&rec));
  Put32(victim.offset + rec.offset, 0);  // type_len 0: the length word follows.
  Put32(victim.offset + rec.offset + 4, 0xfff0);
  Captured c = Capture(range_, formats_);
  ASSERT_FALSE(c.dir.empty());
  EXPECT_EQ(BadPages(c.manifest, 0, "record_past_commit"), 1u);
  EXPECT_EQ(c.result.events, clean->total_records() - (victim.records - 5));
  EXPECT_EQ(TraceCmdCounts(c.dir / "boot-0.trace.dat"), ResultCounts(c.result));
  CmdRun show = RunCommand("'" + Hvtrace() + "' show '" + c.dir.string() + "'");
  EXPECT_EQ(show.status, 0);
}

TEST_F(CapturePipelineMaliciousTest, Malicious_UnknownEventIdsAreCountedAndKeptInTheRegion) {
  KernelFormats fewer = formats_;
  std::erase_if(fewer.events,
                [](const CachedEventFormat& ev) { return ev.name == "sched_switch"; });
  Captured c = Capture(range_, fewer);
  ASSERT_FALSE(c.dir.empty());
  EXPECT_GT(c.result.unknown_id, 100u);
  EXPECT_EQ(c.manifest["validation"]["unknown_id_events"][0].get<uint64_t>() +
                c.manifest["validation"]["unknown_id_events"][1].get<uint64_t>(),
            c.result.unknown_id);
  EXPECT_EQ(ReadText(c.dir / "region.bin").size(), range_.size());
}

TEST_F(CapturePipelineMaliciousTest, Malicious_NoMetaAnywhereFailsAndLeavesNothing) {
  Put32(0, 0);
  Put32(kCpu1, 0);
  CaptureStore store(tmp_ / "captures");
  auto pending = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(pending.ok());
  CaptureManifest manifest;
  auto result = BuildBootMapCapture(range_, formats_, {}, **pending, manifest);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error().message.find("no ring_buffer_meta"), std::string::npos)
      << result.error().message;
  pending->reset();
  auto list = store.List();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
}

TEST_F(CapturePipelineMaliciousTest, Malicious_GarbageEverywhereButTheMagic) {
  uint32_t x = 12345;
  for (size_t i = 0; i < range_.size(); i += 4) {
    x = x * 1103515245 + 12345;
    std::memcpy(range_.data() + i, &x, 4);
  }
  for (uint64_t chunk : {uint64_t{0}, kCpu1}) {
    Put32(chunk, kBootMapMagic);
    Put32(chunk + 4, 56);
    Put32(chunk + 52, 2045);
  }
  Captured c = Capture(range_, formats_);
  ASSERT_FALSE(c.dir.empty());
  EXPECT_GT(c.manifest["validation"]["issues_total"].get<uint64_t>(), 0u);
  for (const CaptureBoot& b : c.result.boots) {
    const fs::path dat = c.dir / b.file;
    // show reads garbage as garbage: it ends with one of its own exit codes
    // (0 shown, 1 usage, 2 bad input), never a signal or a missing binary.
    const int status = RunCommand("'" + Hvtrace() + "' show '" + c.dir.string() + "'").status;
    EXPECT_GE(status, 0);
    EXPECT_LE(status, 2);
    if (b.events != 0) {
      EXPECT_EQ(TraceCmdCounts(dat), ResultCounts(c.result, b.boot));
    }
  }
}

// Item 4: the time the daemon spends after the copy (decode + both files)
// for the 16 MiB fixture, and the copy itself, printed for the report.

}  // namespace
}  // namespace hvtrace::hostd
