// The fleet upload's keys of hvtraced.conf (config.h).
#include <gtest/gtest.h>

#include "config.h"

namespace hvtrace::hostd {
namespace {

TEST(UploadConfig, DefaultsAreOff) {
  Config c;
  EXPECT_TRUE(c.upload_endpoint.empty());
  EXPECT_EQ(c.upload_region, "us-east-1");
  EXPECT_EQ(c.upload_prefix, "hvtrace");
  EXPECT_EQ(c.upload_credentials, "/etc/hvtrace/upload-credentials");
  EXPECT_EQ(c.upload_retry_max, std::chrono::seconds(60));
}

TEST(UploadConfig, KeysParse) {
  auto c = ParseConfig(
      "upload_endpoint = http://127.0.0.1:7480\nupload_bucket = captures\n"
      "upload_region = default\nupload_credentials = /etc/hvtrace/s3\nupload_prefix = fleet/a\n"
      "upload_retry_max = 5s\n",
      "t");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->upload_endpoint, "http://127.0.0.1:7480");
  EXPECT_EQ(c->upload_bucket, "captures");
  EXPECT_EQ(c->upload_region, "default");
  EXPECT_EQ(c->upload_credentials, "/etc/hvtrace/s3");
  EXPECT_EQ(c->upload_prefix, "fleet/a");
  EXPECT_EQ(c->upload_retry_max, std::chrono::seconds(5));
}

TEST(UploadConfig, BadValuesNameTheLine) {
  auto bad = ParseConfig("\nupload_endpoint = s3.example.com\n", "conf");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("conf:2: upload_endpoint"), std::string::npos)
      << bad.error().message;
  EXPECT_FALSE(ParseConfig("upload_retry_max = 0s\n", "t").ok());
  EXPECT_FALSE(ParseConfig("upload_credentials = relative/path\n", "t").ok());
  EXPECT_FALSE(ParseConfig("upload_bucket = a b\n", "t").ok());
}

}  // namespace
}  // namespace hvtrace::hostd
