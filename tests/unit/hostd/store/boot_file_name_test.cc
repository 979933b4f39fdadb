#include "boot_file_name.h"

#include <gtest/gtest.h>

namespace hvtrace::hostd {
namespace {

TEST(BootFileNameTest, NamesRoundTrip) {
  EXPECT_EQ(BootFileName(0), "boot-0.trace.dat");
  EXPECT_EQ(BootFileName(12, kBootHostClockSuffix), "boot-12.host-clock.dat");
  EXPECT_EQ(BootOfFileName("boot-12.trace.dat"), 12u);
  EXPECT_EQ(BootOfFileName("boot-3.host-clock.dat", kBootHostClockSuffix), 3u);
}

TEST(BootFileNameTest, OtherNamesAreNotBoots) {
  for (const char* name : {"boot-.trace.dat", "boot-1.host-clock.dat", "boot-1234567.trace.dat",
                           "boot--1.trace.dat", "boot-1a.trace.dat", "boot-1.trace.dat.tmp",
                           "region-gen-0.trace.dat", "boot-.trace.dat", "boot-"}) {
    EXPECT_FALSE(BootOfFileName(name).has_value()) << name;
  }
  EXPECT_FALSE(BootOfFileName("boot-1.trace.dat", kBootHostClockSuffix).has_value());
}

}  // namespace
}  // namespace hvtrace::hostd
