#include "fleet_keys.h"

#include <gtest/gtest.h>

#include "s3_client.h"

namespace hvtrace::hostd {
namespace {

TEST(FleetKeys, Layout) {
  FleetCaptureRef ref{"hv-0001", "web1", "20261125T040000.123Z-panic"};
  EXPECT_EQ(CaptureKeyPrefix("hvtrace", ref), "hvtrace/hv-0001/web1/20261125T040000.123Z-panic/");
  EXPECT_EQ(CaptureKeyPrefix("", ref), "hv-0001/web1/20261125T040000.123Z-panic/");
  EXPECT_EQ(IndexListPrefix("a/b"), "a/b/index/");
  EXPECT_EQ(IndexListKey("hvtrace", ref),
            "hvtrace/index/hv-0001/web1/20261125T040000.123Z-panic.json");
  EXPECT_EQ(ObjectNameOf("region.bin"), "region.bin.zst");
  EXPECT_EQ(ObjectNameOf("boot-0.trace.dat"), "boot-0.trace.dat");
  EXPECT_EQ(ref.Name(), "hv-0001/web1/20261125T040000.123Z-panic");
}

TEST(FleetKeys, IndexKeysParseBack) {
  FleetCaptureRef ref{"h", "vm-1", "20261125T040000.123Z-panic-while-away-2"};
  auto back = ParseIndexListKey("p", IndexListKey("p", ref));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->host, "h");
  EXPECT_EQ(back->vm, "vm-1");
  EXPECT_EQ(back->id, ref.id);
  auto parts = ParseCaptureId(ref.id);
  ASSERT_TRUE(parts.has_value());
  EXPECT_EQ(parts->utc, "20261125T040000.123Z");
  EXPECT_EQ(parts->trigger, "panic-while-away");
  EXPECT_EQ(ParseCaptureId("20261125T040000.123Z-manual")->trigger, "manual");
}

TEST(FleetKeys, Malicious_ForeignKeysAreSkipped) {
  EXPECT_FALSE(ParseIndexListKey("p", "p/index/h/vm.json"));      // Too short.
  EXPECT_FALSE(ParseIndexListKey("p", "p/index/h/vm/a/b.json"));  // Too deep.
  EXPECT_FALSE(ParseIndexListKey("p", "p/index/h/../x.json"));    // Dots.
  EXPECT_FALSE(ParseIndexListKey("p", "p/index/h/vm/x y.json"));  // Space.
  EXPECT_FALSE(ParseIndexListKey("p", "q/index/h/vm/x.json"));    // Other prefix.
  EXPECT_FALSE(ParseIndexListKey("p", "p/index/h/vm/x.txt"));
  EXPECT_FALSE(ParseCaptureId("nonsense"));
}

TEST(FleetKeys, PrefixAndObjectKeys) {
  EXPECT_EQ(*NormalizePrefix("/fleet/a/"), "fleet/a");
  EXPECT_EQ(*NormalizePrefix(""), "");
  EXPECT_FALSE(NormalizePrefix("a/../b").ok());
  EXPECT_FALSE(NormalizePrefix("a b").ok());
  EXPECT_TRUE(ValidateObjectKey("a/b.c_d-e").ok());
  EXPECT_FALSE(ValidateObjectKey("").ok());
  EXPECT_FALSE(ValidateObjectKey("/a").ok());
  EXPECT_FALSE(ValidateObjectKey("a//b").ok());
  EXPECT_FALSE(ValidateObjectKey("a/./b").ok());
  EXPECT_FALSE(ValidateObjectKey("a/%2e").ok());
  EXPECT_FALSE(ValidateObjectKey(std::string(1025, 'a')).ok());
  const std::string host = FleetHostName();
  EXPECT_FALSE(host.empty());
  EXPECT_TRUE(ValidateObjectKey(host).ok()) << host;
}

TEST(FleetKeys, S3ConfigChecks) {
  S3Config c;
  c.endpoint = "http://127.0.0.1:7480";
  c.bucket = "captures";
  c.access_key = "a";
  c.secret_key = "s";
  EXPECT_TRUE(ValidateS3Config(c).ok());
  c.endpoint = "ftp://x";
  EXPECT_FALSE(ValidateS3Config(c).ok());
  c.endpoint = "http://x/";
  EXPECT_FALSE(ValidateS3Config(c).ok());
  c.endpoint = "https://x";
  c.bucket = "Caps";
  EXPECT_FALSE(ValidateS3Config(c).ok());
  c.bucket = "caps";
  c.region = "a:b";
  EXPECT_FALSE(ValidateS3Config(c).ok());
}

TEST(FleetKeys, Md5ForContentMd5AndEtags) {
  const std::string s = "hello\n";
  EXPECT_EQ(Md5Hex(std::as_bytes(std::span(s))), "b1946ac92492d2347c6235b4d2611184");
  EXPECT_EQ(Md5Base64(std::as_bytes(std::span(s))), "sZRqySSS0jR8YjW00mERhA==");
  EXPECT_EQ(Md5Hex({}), "d41d8cd98f00b204e9800998ecf8427e");
}

}  // namespace
}  // namespace hvtrace::hostd
