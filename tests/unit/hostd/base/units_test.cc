#include "units.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

namespace hvtrace::hostd {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kMiB = 1ull << 20;

TEST(ParseSize, Suffixes) {
  EXPECT_EQ(*ParseSize("16M"), 16 * kMiB);
  EXPECT_EQ(*ParseSize("16m"), 16 * kMiB);
  EXPECT_EQ(*ParseSize("16MiB"), 16 * kMiB);
  EXPECT_EQ(*ParseSize("16MB"), 16 * kMiB);
  EXPECT_EQ(*ParseSize("1G"), 1ull << 30);
  EXPECT_EQ(*ParseSize("1GiB"), 1ull << 30);
  EXPECT_EQ(*ParseSize("2T"), 2ull << 40);
  EXPECT_EQ(*ParseSize("64k"), 64ull << 10);
  EXPECT_EQ(*ParseSize("64K"), 64ull << 10);
  EXPECT_EQ(*ParseSize("1088M"), 1088 * kMiB);
  EXPECT_EQ(*ParseSize("512B"), 512u);
}

TEST(ParseSize, CIntegersAsTheKernelReadsThem) {
  EXPECT_EQ(*ParseSize("0x1000"), 0x1000u);
  EXPECT_EQ(*ParseSize("0x10M"), 16 * kMiB);
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("010"), 8u);  // Octal, as memmap= reads it.
  EXPECT_EQ(*ParseSize("0"), 0u);
}

TEST(ParseSize, BareNumberTakesTheFlagsUnit) {
  EXPECT_EQ(*ParseSize("1088", kMiB), 1088 * kMiB);
  EXPECT_EQ(*ParseSize("16", kMiB), 16 * kMiB);
  EXPECT_EQ(*ParseSize("16", 1), 16u);
  // A suffix wins over the bare unit.
  EXPECT_EQ(*ParseSize("4K", kMiB), 4096u);
  EXPECT_EQ(*ParseSize("0x1000", kMiB), 0x1000 * kMiB);
}

TEST(ParseSize, JunkIsAnError) {
  for (const char* junk : {"", "M", "abc", "16X", "16 M", " 16M", "16M ", "16MiBs", "16iB", "1.5G",
                           "16mb", "0x", "16MM", "--16"}) {
    Result<uint64_t> r = ParseSize(junk, kMiB);
    EXPECT_FALSE(r.ok()) << "'" << junk << "' parsed as " << *r;
  }
  Result<uint64_t> r = ParseSize("16X");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'16X'"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("unknown unit"), std::string::npos) << r.error().message;
}

TEST(ParseSize, NegativeIsAnError) {
  // strtoull would wrap "-1" to 2^64 - 1.
  for (const char* negative : {"-1", "-16M", "+16M", "-0"}) {
    EXPECT_FALSE(ParseSize(negative, kMiB).ok()) << negative;
  }
}

TEST(ParseSize, OverflowIsAnError) {
  EXPECT_FALSE(ParseSize("99999999999999999999").ok());  // Past uint64_t.
  EXPECT_FALSE(ParseSize("16777216T").ok());             // 2^64 bytes.
  EXPECT_FALSE(ParseSize("17179869184G").ok());
  EXPECT_FALSE(ParseSize("17592186044416", kMiB).ok());  // 2^44 MiB.
  EXPECT_EQ(*ParseSize("16777215T"), 16777215ull << 40);
  EXPECT_EQ(*ParseSize("18446744073709551615"), UINT64_MAX);
  EXPECT_FALSE(ParseSize("1234567890123456789012345").ok());  // Longer than any uint64_t.
}

TEST(ParseDuration, Units) {
  EXPECT_EQ(*ParseDuration("30s"), seconds(30));
  EXPECT_EQ(*ParseDuration("500ms"), milliseconds(500));
  EXPECT_EQ(*ParseDuration("2m"), std::chrono::minutes(2));
  EXPECT_EQ(*ParseDuration("2min"), std::chrono::minutes(2));
  EXPECT_EQ(*ParseDuration("1h"), std::chrono::hours(1));
  EXPECT_EQ(*ParseDuration("0s"), milliseconds(0));
}

TEST(ParseDuration, BareNumberTakesTheFlagsUnit) {
  EXPECT_EQ(*ParseDuration("30"), seconds(30));  // Default: seconds.
  EXPECT_EQ(*ParseDuration("30", seconds(1)), seconds(30));
  EXPECT_EQ(*ParseDuration("10000", milliseconds(1)), seconds(10));
  EXPECT_EQ(*ParseDuration("5s", milliseconds(1)), seconds(5));
}

TEST(ParseDuration, DecimalOnly) {
  // "010" is ten seconds, not octal eight; hex is junk.
  EXPECT_EQ(*ParseDuration("010"), seconds(10));
  EXPECT_FALSE(ParseDuration("0x10").ok());
}

TEST(ParseDuration, JunkNegativeAndOverflowAreErrors) {
  for (const char* bad : {"", "s", "abc", "30x", "30 s", "1.5s", "30sec", "-1", "-5s", "+5s", " 5s",
                          "99999999999999999999", "367d", "9000h", "100000000000s"}) {
    Result<milliseconds> r = ParseDuration(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "' parsed as " << r->count() << " ms";
  }
  Result<milliseconds> r = ParseDuration("30x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'30x'"), std::string::npos) << r.error().message;
  EXPECT_EQ(*ParseDuration("8784h"), std::chrono::hours(8784));  // A leap year is the cap.
}

TEST(SizeText, ShortestExactSpelling) {
  EXPECT_EQ(SizeText(16 * kMiB), "16M");
  EXPECT_EQ(SizeText(1ull << 30), "1G");
  EXPECT_EQ(SizeText(1088 * kMiB), "1088M");
  EXPECT_EQ(SizeText(4096), "4K");
  EXPECT_EQ(SizeText(4097), "4097");
  EXPECT_EQ(SizeText(0), "0");
  for (uint64_t bytes :
       {16 * kMiB, uint64_t{1} << 30, uint64_t{4097}, uint64_t{3} << 40, uint64_t{0}}) {
    EXPECT_EQ(*ParseSize(SizeText(bytes)), bytes) << SizeText(bytes);
  }
}

}  // namespace
}  // namespace hvtrace::hostd
