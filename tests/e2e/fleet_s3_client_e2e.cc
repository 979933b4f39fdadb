// The S3 client (hostd/fleet/s3_client.h) against a real radosgw: single and
// multipart PUT with their ETags checked, GET byte-identical, HEAD,
// ListObjectsV2 across continuation tokens, ListMultipartUploads and abort,
// and the errors a fleet operator meets (wrong keys, a missing bucket, the
// store down) named with the store's own code.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "fleet_e2e_support.h"
#include "host_command.h"
#include "s3_client.h"

namespace hvtrace::e2e {
namespace {

namespace fs = std::filesystem;
using hostd::S3Client;
using hostd::S3Config;

S3Config ConfigFor(const CephCluster& ceph, const std::string& bucket) {
  S3Config c;
  c.endpoint = ceph.endpoint();
  c.bucket = bucket;
  c.region = "default";
  c.access_key = ceph.access_key();
  c.secret_key = ceph.secret_key();
  c.attempts = 2;
  c.first_backoff = std::chrono::milliseconds(50);
  return c;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& ch : s) ch = static_cast<char>(rng());
  return s;
}

std::string WriteTemp(const CephCluster& ceph, const std::string& name, const std::string& data) {
  const std::string path = ceph.dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << data;
  return path;
}

TEST(FleetS3Client, PutGetHeadListSmallAndMultipart) {
  HVTRACE_REQUIRE_CEPH(ceph);
  ASSERT_TRUE(ceph.CreateBucket("s3-client-basic").ok());
  S3Client s3(ConfigFor(ceph, "s3-client-basic"));
  ASSERT_TRUE(s3.CheckBucket().ok()) << s3.last_failure().message;

  const std::string small = RandomBytes(100000, 1);
  auto etag = s3.PutBytes("a/small.bin", std::as_bytes(std::span(small)));
  ASSERT_TRUE(etag.ok()) << etag.error().message;
  EXPECT_EQ(*etag, hostd::Md5Hex(std::as_bytes(std::span(small))));

  // 20 MiB + 3 bytes: three parts of 8, 8 and 4 MiB + 3.
  const std::string big = RandomBytes((20u << 20) + 3, 2);
  const std::string big_path = WriteTemp(ceph, "big.bin", big);
  std::string upload_id;
  const auto t0 = std::chrono::steady_clock::now();
  auto big_etag = s3.PutFile("a/big.bin", big_path, [&](const std::string& id) { upload_id = id; });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(big_etag.ok()) << big_etag.error().message;
  EXPECT_FALSE(upload_id.empty());
  EXPECT_TRUE(big_etag->ends_with("-3")) << *big_etag;
  std::printf("[fleet e2e] multipart PUT of 20 MiB: %.2f s (%.1f MB/s)\n", secs,
              static_cast<double>(big.size()) / secs / 1e6);

  auto head = s3.Head("a/big.bin");
  ASSERT_TRUE(head.ok()) << head.error().message;
  EXPECT_EQ(head->size, big.size());

  const std::string got_path = ceph.dir() + "/big.got";
  fs::remove(got_path);
  ASSERT_TRUE(s3.GetToFile("a/big.bin", got_path, 64u << 20).ok()) << s3.last_failure().message;
  EXPECT_TRUE(ReadWhole(got_path) == big);
  auto got_small = s3.GetBytes("a/small.bin", 1 << 20);
  ASSERT_TRUE(got_small.ok()) << got_small.error().message;
  EXPECT_TRUE(*got_small == small);
  // The cap holds: a download larger than allowed is refused, not stored.
  fs::remove(got_path);
  EXPECT_FALSE(s3.GetToFile("a/big.bin", got_path, 1 << 20).ok());
  EXPECT_FALSE(fs::exists(got_path));

  auto listed = s3.List("a/");
  ASSERT_TRUE(listed.ok()) << listed.error().message;
  ASSERT_EQ(listed->size(), 2u);
  auto none = s3.ListMultipartUploads("");
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_TRUE(none->empty());
}

TEST(FleetS3Client, ListFollowsContinuationTokens) {
  HVTRACE_REQUIRE_CEPH(ceph);
  ASSERT_TRUE(ceph.CreateBucket("s3-client-list").ok());
  S3Client s3(ConfigFor(ceph, "s3-client-list"));
  // 1000 keys per page: 1005 objects need two pages.
  for (int i = 0; i < 1005; ++i) {
    const std::string body = std::to_string(i);
    ASSERT_TRUE(s3.PutBytes("many/k" + std::to_string(i), std::as_bytes(std::span(body))).ok())
        << s3.last_failure().message;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto listed = s3.List("many/");
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(listed.ok()) << listed.error().message;
  EXPECT_EQ(listed->size(), 1005u);
  std::printf("[fleet e2e] ListObjectsV2 of 1005 keys (2 pages): %.1f ms\n", ms);
  auto capped = s3.List("many/", 10);
  EXPECT_FALSE(capped.ok());
}

TEST(FleetS3Client, AbortedMultipartLeavesNothing) {
  HVTRACE_REQUIRE_CEPH(ceph);
  ASSERT_TRUE(ceph.CreateBucket("s3-client-abort").ok());
  S3Client s3(ConfigFor(ceph, "s3-client-abort"));
  // An upload someone left (a daemon killed mid-object): listed, then aborted.
  RunResult init = RunArgvStatus({"curl", "-s", "-X", "POST", "--aws-sigv4", "aws:amz:default:s3",
                                  "--user", ceph.access_key() + ":" + ceph.secret_key(), "-H",
                                  "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                                  ceph.endpoint() + "/s3-client-abort/left/over.bin?uploads="});
  ASSERT_EQ(init.status, 0) << init.output;
  auto uploads = s3.ListMultipartUploads("left/");
  ASSERT_TRUE(uploads.ok()) << uploads.error().message;
  ASSERT_EQ(uploads->size(), 1u) << init.output;
  EXPECT_EQ((*uploads)[0].key, "left/over.bin");
  ASSERT_TRUE(s3.AbortMultipart("left/over.bin", (*uploads)[0].upload_id).ok())
      << s3.last_failure().message;
  auto after = s3.ListMultipartUploads("left/");
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->empty());
}

TEST(FleetS3Client, ErrorsNameTheStoresCode) {
  HVTRACE_REQUIRE_CEPH(ceph);
  ASSERT_TRUE(ceph.CreateBucket("s3-client-errors").ok());
  const std::string body = "x";
  {
    S3Config c = ConfigFor(ceph, "s3-client-errors");
    c.access_key = "NOSUCHKEY";
    S3Client s3(c);
    EXPECT_FALSE(s3.PutBytes("k", std::as_bytes(std::span(body))).ok());
    EXPECT_EQ(s3.last_failure().http_status, 403);
    EXPECT_EQ(s3.last_failure().code, "InvalidAccessKeyId") << s3.last_failure().message;
    EXPECT_NE(s3.last_failure().message.find(ceph.endpoint() + "/s3-client-errors/k"),
              std::string::npos)
        << s3.last_failure().message;
  }
  {
    S3Config c = ConfigFor(ceph, "s3-client-errors");
    c.secret_key = "wrong-secret";
    S3Client s3(c);
    EXPECT_FALSE(s3.CheckBucket().ok());
    EXPECT_EQ(s3.last_failure().code, "SignatureDoesNotMatch") << s3.last_failure().message;
  }
  {
    S3Client s3(ConfigFor(ceph, "no-such-bucket"));
    EXPECT_FALSE(s3.PutBytes("k", std::as_bytes(std::span(body))).ok());
    EXPECT_EQ(s3.last_failure().http_status, 404);
    EXPECT_EQ(s3.last_failure().code, "NoSuchBucket") << s3.last_failure().message;
    EXPECT_FALSE(s3.Head("k").ok());
  }
  {
    // Nothing listens: a connection error, retried, then reported.
    S3Config c = ConfigFor(ceph, "s3-client-errors");
    c.endpoint = "http://127.0.0.1:1";
    S3Client s3(c);
    EXPECT_FALSE(s3.CheckBucket().ok());
    EXPECT_EQ(s3.last_failure().http_status, 0);
    EXPECT_NE(s3.last_failure().message.find("127.0.0.1:1"), std::string::npos)
        << s3.last_failure().message;
  }
}

}  // namespace
}  // namespace hvtrace::e2e
