// formats-harvest's arguments (formats_args.h): the kernel's path for
// messages, a bounded boot timeout, and never a client's initrd.
#include "formats_args.h"

#include <gtest/gtest.h>

#include <string>

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

TEST(FormatsHarvestArgs, Defaults) {
  auto a = ParseFormatsHarvestArgs({{"kernel", "/boot/vmlinuz-6.12"}, {"kernel_fd", 0}});
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->kernel, "/boot/vmlinuz-6.12");
  EXPECT_EQ(a->timeout.count(), 180000);
}

TEST(FormatsHarvestArgs, Timeout) {
  auto a = ParseFormatsHarvestArgs({{"kernel", "k"}, {"timeout_ms", 5000}});
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->timeout.count(), 5000);
  auto low = ParseFormatsHarvestArgs({{"kernel", "k"}, {"timeout_ms", 999}});
  ASSERT_FALSE(low.ok());
  EXPECT_NE(low.error().message.find("timeout_ms = 999 is outside 1000..3600000"),
            std::string::npos)
      << low.error().message;
  EXPECT_FALSE(ParseFormatsHarvestArgs({{"kernel", "k"}, {"timeout_ms", 3600001}}).ok());
  EXPECT_TRUE(ParseFormatsHarvestArgs({{"kernel", "k"}, {"timeout_ms", nullptr}}).ok());
}

// The harvest guest's report becomes the formats of every VM with that
// kernel: a client's initrd is refused with the reason and the way out.
TEST(FormatsHarvestArgs, Malicious_ClientInitrdIsRefused) {
  auto a = ParseFormatsHarvestArgs(
      {{"kernel", "/home/u/vmlinuz"}, {"initrd", "/home/u/evil.img"}, {"initrd_fd", 1}});
  ASSERT_FALSE(a.ok());
  const std::string& m = a.error().message;
  EXPECT_NE(m.find("formats-harvest /home/u/vmlinuz"), std::string::npos) << m;
  EXPECT_NE(m.find("only with its own initramfs (harvest_initrd"), std::string::npos) << m;
  EXPECT_NE(m.find("--cache DIR --initrd I"), std::string::npos) << m;
  // Any non-null value, whatever its type.
  EXPECT_FALSE(ParseFormatsHarvestArgs({{"kernel", "k"}, {"initrd", ""}}).ok());
  EXPECT_FALSE(ParseFormatsHarvestArgs({{"kernel", "k"}, {"initrd", 3}}).ok());
  EXPECT_TRUE(ParseFormatsHarvestArgs({{"kernel", "k"}, {"initrd", nullptr}}).ok());
}

TEST(FormatsHarvestArgs, Malicious_WrongTypesAndSizes) {
  EXPECT_FALSE(ParseFormatsHarvestArgs(json::array()).ok());
  EXPECT_FALSE(ParseFormatsHarvestArgs(json::object()).ok());
  EXPECT_FALSE(ParseFormatsHarvestArgs({{"kernel", ""}}).ok());
  EXPECT_FALSE(ParseFormatsHarvestArgs({{"kernel", 7}}).ok());
  EXPECT_FALSE(ParseFormatsHarvestArgs({{"kernel", json::array({"a"})}}).ok());
  auto long_path = ParseFormatsHarvestArgs({{"kernel", std::string(5000, 'k')}});
  ASSERT_FALSE(long_path.ok());
  EXPECT_NE(long_path.error().message.find("longer than 4096 bytes"), std::string::npos);
  EXPECT_FALSE(ParseFormatsHarvestArgs({{"kernel", "k"}, {"timeout_ms", -5}}).ok());
  EXPECT_FALSE(ParseFormatsHarvestArgs({{"kernel", "k"}, {"timeout_ms", "60s"}}).ok());
  EXPECT_FALSE(ParseFormatsHarvestArgs({{"kernel", "k"}, {"timeout_ms", 1.5e4}}).ok());
}

}  // namespace
}  // namespace hvtrace::hostd
