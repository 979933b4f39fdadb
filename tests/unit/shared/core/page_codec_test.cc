#include "hvtrace/page.h"

// kbuffer.h has no extern "C" guard of its own.
extern "C" {
#include <kbuffer.h>
}

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace hvtrace {
namespace {

using Bytes = std::vector<std::byte>;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

Bytes ReadBytes(const std::string& path) {
  std::string s = ReadText(path);
  Bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

void Put32(Bytes& page, size_t at, uint32_t v) { std::memcpy(page.data() + at, &v, 4); }
void Put64(Bytes& page, size_t at, uint64_t v) { std::memcpy(page.data() + at, &v, 8); }

Bytes Payload(size_t n, uint16_t type = 7) {
  Bytes p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(i * 13 + 1);
  if (n >= 2) std::memcpy(p.data(), &type, 2);
  return p;
}

// One record as seen by a reader: time stamp, payload offset and size.
struct Seen {
  uint64_t ts;
  size_t offset;
  size_t size;
  bool operator==(const Seen&) const = default;
};

std::vector<Seen> WalkOurs(const Bytes& page, PageError* error = nullptr,
                           const PageLayout& layout = PageLayout::Default()) {
  std::vector<Seen> out;
  PageCursor cursor(page, layout);
  RawRecord rec;
  while (cursor.Next(&rec)) {
    EXPECT_GE(rec.payload.data(), page.data());
    EXPECT_LE(rec.payload.data() + rec.payload.size(), page.data() + page.size());
    out.push_back(
        {rec.timestamp, static_cast<size_t>(rec.payload.data() - page.data()), rec.payload.size()});
  }
  if (error) *error = cursor.error();
  return out;
}

// libtraceevent's kbuffer, the reference reader for pages a kernel wrote.
std::vector<Seen> WalkKbuffer(Bytes page) {
  std::vector<Seen> out;
  kbuffer* kbuf = kbuffer_alloc(KBUFFER_LSIZE_8, KBUFFER_ENDIAN_LITTLE);
  kbuffer_load_subbuffer(kbuf, page.data());
  unsigned long long ts = 0;
  for (void* data = kbuffer_read_event(kbuf, &ts); data; data = kbuffer_next_event(kbuf, &ts)) {
    out.push_back({ts, static_cast<size_t>(static_cast<std::byte*>(data) - page.data()),
                   static_cast<size_t>(kbuffer_event_size(kbuf))});
  }
  kbuffer_free(kbuf);
  return out;
}

TEST(PageLayoutTest, ParsesRealHeaderPage) {
  auto layout = PageLayout::FromHeaderPage(
      ReadText(std::string(HVTRACE_FIXTURES_DIR) + "/pages/header_page.txt"), 4096);
  ASSERT_TRUE(layout.ok()) << layout.error().message;
  EXPECT_EQ(layout->timestamp_offset, 0u);
  EXPECT_EQ(layout->timestamp_size, 8u);
  EXPECT_EQ(layout->commit_offset, 8u);
  EXPECT_EQ(layout->commit_size, 8u);
  EXPECT_EQ(layout->data_offset, 16u);
  EXPECT_EQ(layout->page_size, 4096u);
}

TEST(PageLayoutTest, ParsesThirtyTwoBitLayout) {
  const char* text =
      "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
      "\tfield: local_t commit;\toffset:8;\tsize:4;\tsigned:1;\n"
      "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
      "\tfield: char data;\toffset:12;\tsize:4084;\tsigned:0;\n";
  auto layout = PageLayout::FromHeaderPage(text, 4096);
  ASSERT_TRUE(layout.ok()) << layout.error().message;
  EXPECT_EQ(layout->commit_size, 4u);
  EXPECT_EQ(layout->data_offset, 12u);
}

TEST(PageLayoutTest, Malicious_RejectsBadHeaderPages) {
  const std::string ts = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n";
  const std::string commit = "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n";
  const std::string data = "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n";
  EXPECT_FALSE(PageLayout::FromHeaderPage("", 4096).ok());
  EXPECT_FALSE(PageLayout::FromHeaderPage(ts + commit, 4096).ok());  // No data.
  EXPECT_FALSE(PageLayout::FromHeaderPage(ts + data, 4096).ok());    // No commit.
  EXPECT_FALSE(PageLayout::FromHeaderPage(
                   ts + "\tfield: local_t commit;\toffset:8;\tsize:3;\tsigned:1;\n" + data, 4096)
                   .ok());
  EXPECT_FALSE(PageLayout::FromHeaderPage(
                   ts + commit + "\tfield: char data;\toffset:99999;\tsize:1;\tsigned:0;\n", 4096)
                   .ok());
  EXPECT_FALSE(PageLayout::FromHeaderPage(
                   ts + commit + "\tfield: char data;\toffset:8;\tsize:1;\tsigned:0;\n", 4096)
                   .ok());  // Data overlaps commit.
  EXPECT_FALSE(
      PageLayout::FromHeaderPage(
          ts + "\tfield: local_t commit;\toffset:18446744073709551615;\tsize:8;\n" + data, 4096)
          .ok());
  EXPECT_FALSE(PageLayout::FromHeaderPage(ts + commit + data, 16).ok());  // No room for data.
  EXPECT_FALSE(PageLayout::FromHeaderPage(ts + commit + data, 0x10000000).ok());
  EXPECT_FALSE(PageLayout::FromHeaderPage(
                   "\tfield: u64 timestamp;\toffset:;\tsize:8;\n" + commit + data, 4096)
                   .ok());
}

class RealPageTest : public ::testing::TestWithParam<const char*> {};

TEST_P(RealPageTest, AgreesWithKbuffer) {
  Bytes page = ReadBytes(std::string(HVTRACE_FIXTURES_DIR) + "/pages/" + GetParam());
  ASSERT_EQ(page.size(), 4096u);
  PageError error;
  std::vector<Seen> ours = WalkOurs(page, &error);
  EXPECT_EQ(error, PageError::kOk) << PageErrorName(error);
  std::vector<Seen> theirs = WalkKbuffer(page);
  ASSERT_FALSE(ours.empty());
  EXPECT_EQ(ours, theirs);
  for (size_t i = 1; i < ours.size(); ++i) EXPECT_GE(ours[i].ts, ours[i - 1].ts) << i;
  // Every payload starts with struct trace_entry (8 bytes).
  for (const Seen& s : ours) EXPECT_GE(s.size, 8u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RealPageTest,
                         ::testing::Values("cpu0-0.bin", "cpu0-1.bin", "cpu0-2.bin", "cpu1-0.bin",
                                           "cpu1-1.bin", "cpu1-2.bin"));

TEST(RealPageTest, FirstReadAfterOverflowHasMissedEvents) {
  // make-fixtures.sh overflows a small buffer before reading, so the first
  // page read per CPU carries RB_MISSED_EVENTS (the kernel sign-extends the
  // flags through the 8-byte commit).
  Bytes page = ReadBytes(std::string(HVTRACE_FIXTURES_DIR) + "/pages/cpu0-0.bin");
  PageCursor cursor(page, PageLayout::Default());
  EXPECT_TRUE(cursor.header().missed_events);
  EXPECT_LE(cursor.header().commit, 4080u);
  PageStats stats;
  WalkPage(page, PageLayout::Default(), &stats, [](const RawRecord&) {});
  EXPECT_EQ(stats.pages, 1u);
  EXPECT_EQ(stats.pages_with_missed_events, 1u);
  EXPECT_EQ(stats.rejected_total(), 0u);
}

TEST(PageWriterTest, RoundTripsThroughCursorAndKbuffer) {
  Bytes page(4096);
  const uint64_t t0 = 1'000'000'000'000;
  PageWriter writer(page, PageLayout::Default(), t0);
  struct Want {
    uint64_t ts;
    size_t size;
  };
  std::vector<Want> want;
  uint64_t ts = t0;
  const size_t sizes[] = {8, 12, 16, 20, 109, 112, 113, 116, 200, 1000, 9, 36};
  const uint64_t gaps[] = {0, 1, 100, (1u << 27) - 1, 1u << 27, 5'000'000'000, 3, 0};
  for (int i = 0; i < 24; ++i) {
    ts += gaps[i % 8];
    size_t n = sizes[i % 12];
    Bytes p = Payload(n, static_cast<uint16_t>(i));
    if (!writer.Append(ts, p)) break;
    want.push_back({ts, n});
  }
  writer.Finish();
  ASSERT_GE(want.size(), 10u);
  PageError error;
  std::vector<Seen> ours = WalkOurs(page, &error);
  ASSERT_EQ(error, PageError::kOk) << PageErrorName(error);
  ASSERT_EQ(ours.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(ours[i].ts, want[i].ts) << i;
    EXPECT_EQ(ours[i].size, (want[i].size + 3) & ~size_t{3}) << i;
    Bytes p = Payload(want[i].size, static_cast<uint16_t>(i));
    EXPECT_EQ(std::memcmp(page.data() + ours[i].offset, p.data(), p.size()), 0) << i;
  }
  EXPECT_EQ(WalkKbuffer(page), ours);
}

TEST(PageWriterTest, AbsoluteTimeStampsAndHugeGaps) {
  Bytes page(4096);
  const uint64_t t0 = 5;
  PageWriter writer(page, PageLayout::Default(), t0);
  ASSERT_TRUE(writer.Append(10, Payload(8)));
  ASSERT_TRUE(writer.AppendAbsoluteTime(1'000'000));
  ASSERT_TRUE(writer.Append(1'000'007, Payload(8)));
  ASSERT_TRUE(writer.Append(uint64_t{1} << 60, Payload(8)));  // Gap past 59 bits.
  ASSERT_TRUE(writer.Append((uint64_t{1} << 60) + 1, Payload(8)));
  EXPECT_FALSE(writer.Append(100, Payload(8)));  // Backwards: refused.
  // A TIME_STAMP stores 59 bits and takes the top bits from the time before
  // it; one that crosses more than one 2^59 step cannot be restored.
  EXPECT_FALSE(writer.AppendAbsoluteTime(uint64_t{1} << 62));
  writer.Finish();
  std::vector<Seen> ours = WalkOurs(page);
  ASSERT_EQ(ours.size(), 4u);
  EXPECT_EQ(ours[0].ts, 10u);
  EXPECT_EQ(ours[1].ts, 1'000'007u);
  EXPECT_EQ(ours[2].ts, uint64_t{1} << 60);
  EXPECT_EQ(ours[3].ts, (uint64_t{1} << 60) + 1);
  EXPECT_EQ(WalkKbuffer(page), ours);
}

TEST(PageWriterTest, GapNearTwoToTheSixtyFourTakesEveryExtend) {
  // A delta within 2^59 of 2^64 needs 32 TIME_EXTENDs; rounding it up by
  // adding before dividing wrapped and wrote none (found by page_fuzzer).
  Bytes page(4096);
  PageWriter writer(page, PageLayout::Default(), 0);
  const uint64_t late = ~uint64_t{0} - 3;
  ASSERT_TRUE(writer.Append(late, Payload(8)));
  writer.Finish();
  std::vector<Seen> ours = WalkOurs(page);
  ASSERT_EQ(ours.size(), 1u);
  EXPECT_EQ(ours[0].ts, late);
  EXPECT_EQ(WalkKbuffer(page), ours);
}

TEST(PageWriterTest, AbsoluteTimeKeepsTopBitsOfPageTime) {
  Bytes page(4096);
  const uint64_t t0 = (uint64_t{0x18} << 56) | 1000;  // Top 5 bits set.
  PageWriter writer(page, PageLayout::Default(), t0);
  ASSERT_TRUE(writer.AppendAbsoluteTime(t0 + 50));
  ASSERT_TRUE(writer.Append(t0 + 60, Payload(8)));
  writer.Finish();
  std::vector<Seen> ours = WalkOurs(page);
  ASSERT_EQ(ours.size(), 1u);
  EXPECT_EQ(ours[0].ts, t0 + 60);
}

TEST(PageCursorTest, AbsoluteTimeCarriesIntoTopBits) {
  // Running time just below a 2^59 boundary with top bits set; the absolute
  // time stamp's 59 bits wrapped, so the kernel adds 2^59.
  Bytes page(4096);
  const uint64_t t0 = (uint64_t{0x08} << 56) | ((uint64_t{1} << 59) - 10);
  Put64(page, 0, t0);
  const uint64_t abs_low = 5;  // (t0 + 15) mod 2^59
  Put32(page, 16, kRecordTypeTimeStamp | static_cast<uint32_t>((abs_low & kTimeDeltaMax) << 5));
  Put32(page, 20, static_cast<uint32_t>(abs_low >> 27));
  Put32(page, 24, 2u);  // type_len 2: 8 bytes of payload, delta 0.
  Put64(page, 8, 20);
  std::vector<Seen> ours = WalkOurs(page);
  ASSERT_EQ(ours.size(), 1u);
  EXPECT_EQ(ours[0].ts, t0 + 15);
}

TEST(PageWriterTest, MissedEventsStoredAfterData) {
  Bytes page(4096);
  PageWriter writer(page, PageLayout::Default(), 100);
  ASSERT_TRUE(writer.Append(101, Payload(16)));
  ASSERT_TRUE(writer.SetMissedEvents(12345));
  writer.Finish();
  PageCursor cursor(page, PageLayout::Default());
  EXPECT_TRUE(cursor.header().missed_events);
  EXPECT_TRUE(cursor.header().missed_stored);
  EXPECT_EQ(cursor.missed_count(), 12345u);
  EXPECT_EQ(cursor.header().commit, 20u);
  Bytes copy = page;
  kbuffer* kbuf = kbuffer_alloc(KBUFFER_LSIZE_8, KBUFFER_ENDIAN_LITTLE);
  kbuffer_load_subbuffer(kbuf, copy.data());
  EXPECT_EQ(kbuffer_missed_events(kbuf), 12345);
  kbuffer_free(kbuf);
}

TEST(PageWriterTest, FillsToCapacityAndRefusesMore) {
  Bytes page(256);
  PageLayout layout = PageLayout::Default(256);
  PageWriter writer(page, layout, 0);
  EXPECT_EQ(writer.capacity(), 240u);
  int n = 0;
  while (writer.Append(static_cast<uint64_t>(n), Payload(20))) ++n;
  EXPECT_EQ(n, 10);  // 240 / 24.
  EXPECT_EQ(writer.used(), 240u);
  Bytes before = page;
  EXPECT_FALSE(writer.Append(1000, Payload(8)));
  EXPECT_EQ(page, before);                  // Nothing written on refusal.
  EXPECT_FALSE(writer.SetMissedEvents(3));  // No room for the count.
  writer.Finish();
  EXPECT_EQ(WalkOurs(page, nullptr, layout).size(), 10u);
}

TEST(PageWriterTest, TinyBufferWritesNothing) {
  Bytes page(8);
  PageWriter writer(page, PageLayout::Default(), 0);
  EXPECT_EQ(writer.capacity(), 0u);
  EXPECT_FALSE(writer.Append(1, Payload(8)));
  writer.Finish();
  EXPECT_EQ(page, Bytes(8));
}

TEST(PageCursorTest, DiscardedEventPaddingIsSkippedWithItsDelta) {
  Bytes page(4096);
  Put64(page, 0, 1000);
  Put32(page, 16, kRecordTypePadding | (7u << 5));  // Discarded, delta 7.
  Put32(page, 20, 12);                              // 12 bytes after header.
  Put32(page, 32, 2u | (3u << 5));                  // Data, delta 3.
  Put32(page, 44, kRecordTypePadding | (1u << 5));  // Discarded, delta marker 1.
  Put32(page, 48, 4);
  Put32(page, 52, 2u | (4u << 5));
  Put32(page, 64, kRecordTypePadding);  // Rest of page unused.
  Put64(page, 8, 64 - 16 + 4);
  PageError error;
  std::vector<Seen> ours = WalkOurs(page, &error);
  EXPECT_EQ(error, PageError::kOk);
  ASSERT_EQ(ours.size(), 2u);
  EXPECT_EQ(ours[0].ts, 1010u);
  EXPECT_EQ(ours[0].offset, 36u);
  EXPECT_EQ(ours[1].ts, 1014u);
}

// ---- Hostile pages ----------------------------------------------------

Bytes PageWithCommit(uint64_t commit) {
  Bytes page(4096);
  Put64(page, 0, 1);
  Put64(page, 8, commit);
  return page;
}

PageError FirstError(const Bytes& page, size_t* records = nullptr,
                     const PageLayout& layout = PageLayout::Default()) {
  PageError error;
  std::vector<Seen> seen = WalkOurs(page, &error, layout);
  if (records) *records = seen.size();
  return error;
}

TEST(PageCursorTest, Malicious_CommitLargerThanPage) {
  EXPECT_EQ(FirstError(PageWithCommit(4081)), PageError::kCommitPastEnd);
  EXPECT_EQ(FirstError(PageWithCommit(kPageCommitMask)), PageError::kCommitPastEnd);
  // Flags above the 27 bits do not count as size.
  EXPECT_EQ(FirstError(PageWithCommit(0xffffffff80000000ull)), PageError::kOk);
  // A copy shorter than the layout's page bounds commit by the copy.
  Bytes page = PageWithCommit(100);
  page.resize(64);
  EXPECT_EQ(FirstError(page), PageError::kCommitPastEnd);
}

TEST(PageCursorTest, Malicious_ShortPageAndAbsurdLayout) {
  Bytes page(10);
  EXPECT_EQ(FirstError(page), PageError::kShortPage);
  Bytes empty;
  EXPECT_EQ(FirstError(empty), PageError::kShortPage);
  PageLayout layout = PageLayout::Default();
  layout.commit_offset = 0xfffffff0;
  EXPECT_EQ(FirstError(PageWithCommit(0), nullptr, layout), PageError::kShortPage);
  layout = PageLayout::Default();
  layout.data_offset = 0xffffffff;
  EXPECT_EQ(FirstError(PageWithCommit(0), nullptr, layout), PageError::kShortPage);
  layout = PageLayout::Default();
  layout.commit_size = 0;
  EXPECT_EQ(FirstError(PageWithCommit(0), nullptr, layout), PageError::kShortPage);
}

TEST(PageCursorTest, Malicious_ZeroAndOversizedRecords) {
  Bytes page = PageWithCommit(64);
  Put32(page, 16, 0);  // type_len 0 ...
  Put32(page, 20, 0);  // ... with length 0.
  EXPECT_EQ(FirstError(page), PageError::kZeroLength);
  Put32(page, 20, 4);  // Length that covers only itself.
  EXPECT_EQ(FirstError(page), PageError::kZeroLength);
  Put32(page, 20, 0xffffffff);
  EXPECT_EQ(FirstError(page), PageError::kRecordPastCommit);
  Put32(page, 20, 61);  // Rounds up past commit.
  EXPECT_EQ(FirstError(page), PageError::kRecordPastCommit);
  Put32(page, 20, 60);  // Exactly fills commit.
  size_t n = 0;
  EXPECT_EQ(FirstError(page, &n), PageError::kOk);
  EXPECT_EQ(n, 1u);
  Put32(page, 16, 28);  // type_len 28: 112 bytes > 60 left.
  EXPECT_EQ(FirstError(page), PageError::kRecordPastCommit);
}

TEST(PageCursorTest, Malicious_TruncatedHeaders) {
  Bytes page = PageWithCommit(2);  // Not even one header word.
  EXPECT_EQ(FirstError(page), PageError::kTruncatedHeader);
  page = PageWithCommit(12);
  Put32(page, 16, 1);                      // 8-byte record.
  Put32(page, 24, kRecordTypeTimeExtend);  // Needs 8, only 4 left.
  size_t n = 0;
  EXPECT_EQ(FirstError(page, &n), PageError::kTruncatedHeader);
  EXPECT_EQ(n, 1u);  // The good record before it still counts.
  page = PageWithCommit(4);
  Put32(page, 16, 0);  // type_len 0 without room for the length word.
  EXPECT_EQ(FirstError(page), PageError::kTruncatedHeader);
}

TEST(PageCursorTest, Malicious_PaddingLoopsAndBadPadding) {
  // A page full of minimal discarded events: the walk advances every time and
  // ends; no record comes out.
  Bytes page = PageWithCommit(4080);
  for (size_t at = 16; at + 8 <= 4096; at += 8) {
    Put32(page, at, kRecordTypePadding | (1u << 5));
    Put32(page, at + 4, 4);
  }
  size_t n = 99;
  EXPECT_EQ(FirstError(page, &n), PageError::kOk);
  EXPECT_EQ(n, 0u);
  // Padding length that would not move forward, or not aligned, or past commit.
  for (uint32_t bad : {0u, 2u, 7u, 4077u, 0xfffffffcu}) {
    Bytes p = PageWithCommit(4080);
    Put32(p, 16, kRecordTypePadding | (5u << 5));
    Put32(p, 20, bad);
    EXPECT_EQ(FirstError(p), PageError::kBadPadding) << bad;
  }
}

TEST(PageCursorTest, Malicious_TimeGoingBackwards) {
  Bytes page = PageWithCommit(24);
  Put64(page, 0, 1'000'000);
  Put32(page, 16, 2u | (5u << 5));                     // Data at 1'000'005.
  Put32(page, 28, kRecordTypeTimeStamp | (10u << 5));  // Absolute 10.
  Put32(page, 32, 0);
  size_t n = 0;
  EXPECT_EQ(FirstError(page, &n), PageError::kTimeWentBackwards);
  EXPECT_EQ(n, 1u);
  PageStats stats;
  EXPECT_EQ(WalkPage(page, PageLayout::Default(), &stats, [](const RawRecord&) {}),
            PageError::kTimeWentBackwards);
  EXPECT_EQ(stats.records, 1u);
  EXPECT_EQ(stats.rejected[static_cast<size_t>(PageError::kTimeWentBackwards)], 1u);
  EXPECT_STREQ(PageErrorName(PageError::kTimeWentBackwards), "time_went_backwards");
}

TEST(PageCursorTest, Malicious_MissedCountPastEnd) {
  Bytes page = PageWithCommit(4080 | kPageMissedEvents | kPageMissedStored);
  EXPECT_EQ(FirstError(page), PageError::kMissedCountPastEnd);
  page = PageWithCommit(4076 | kPageMissedEvents | kPageMissedStored);  // 4 bytes left.
  EXPECT_EQ(FirstError(page), PageError::kMissedCountPastEnd);
  page = PageWithCommit(4072 | kPageMissedEvents | kPageMissedStored);
  Put64(page, 16 + 4072, 77);
  for (size_t at = 16; at < 16 + 4072; at += 8) Put32(page, at, 1);
  PageCursor cursor(page, PageLayout::Default());
  EXPECT_EQ(cursor.missed_count(), 77u);
  RawRecord rec;
  size_t n = 0;
  while (cursor.Next(&rec)) ++n;
  EXPECT_EQ(cursor.error(), PageError::kOk);
  EXPECT_EQ(n, 4072u / 8);
}

TEST(PageCursorTest, Malicious_RandomBytesStayInBounds) {
  std::mt19937_64 rng(42);
  PageStats stats;
  for (int round = 0; round < 3000; ++round) {
    Bytes page(round % 7 == 0 ? rng() % 64 : 4096);
    for (auto& b : page) b = static_cast<std::byte>(rng());
    // Make many pages pass the commit check so that records get walked.
    if (page.size() >= 16 && round % 2 == 0) Put32(page, 8, static_cast<uint32_t>(rng() % 4081));
    WalkPage(page, PageLayout::Default(), &stats, [&](const RawRecord& rec) {
      ASSERT_GE(rec.payload.data(), page.data() + 16);
      ASSERT_LE(rec.payload.data() + rec.payload.size(), page.data() + page.size());
    });
  }
  EXPECT_EQ(stats.pages, 3000u);
  EXPECT_GT(stats.rejected_total(), 0u);
  EXPECT_GT(stats.records, 0u);
}

}  // namespace
}  // namespace hvtrace
