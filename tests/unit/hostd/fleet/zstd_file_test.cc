#include "zstd_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

std::string RoundTrip(const fs::path& dir, const std::string& data) {
  std::ofstream(dir / "in", std::ios::binary | std::ios::trunc) << data;
  fs::remove(dir / "packed");
  fs::remove(dir / "out");
  EXPECT_TRUE(CompressFile(dir / "in", dir / "packed").ok());
  Status s = DecompressFile(dir / "packed", dir / "out", 1ull << 32);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return test_support::ReadText((dir / "out").string());
}

TEST(ZstdFile, RoundTripsRegionsOfEveryShape) {
  test_support::TempDir tmp("zstd-file");
  std::mt19937 rng(3);
  std::string random(3u << 20, '\0');
  for (char& c : random) c = static_cast<char>(rng());
  // A ring buffer that is mostly zeros: a tiny frame with a huge output.
  std::string sparse(16u << 20, '\0');
  for (size_t i = 0; i < 200000; ++i) sparse[i] = static_cast<char>(rng());
  for (const std::string* data : {&random, &sparse}) {
    EXPECT_TRUE(RoundTrip(tmp.path(), *data) == *data);
  }
  EXPECT_TRUE(RoundTrip(tmp.path(), "").empty());
  std::string zeros(16u << 20, '\0');
  EXPECT_TRUE(RoundTrip(tmp.path(), zeros) == zeros);
}

TEST(ZstdFile, Malicious_BombsAndTruncatedFramesAreRefused) {
  test_support::TempDir tmp("zstd-file");
  std::string zeros(8u << 20, '\0');
  std::ofstream(tmp.path() / "in", std::ios::binary) << zeros;
  ASSERT_TRUE(CompressFile(tmp.path() / "in", tmp.path() / "packed").ok());
  // The cap holds whatever the frame claims.
  Status capped = DecompressFile(tmp.path() / "packed", tmp.path() / "out", 1u << 20);
  ASSERT_FALSE(capped.ok());
  EXPECT_NE(capped.error().message.find("more than"), std::string::npos);
  std::string packed = test_support::ReadText((tmp.path() / "packed").string());
  std::ofstream(tmp.path() / "cut", std::ios::binary) << packed.substr(0, packed.size() / 2);
  fs::remove(tmp.path() / "out");
  EXPECT_FALSE(DecompressFile(tmp.path() / "cut", tmp.path() / "out", 1ull << 32).ok());
  std::ofstream(tmp.path() / "junk", std::ios::binary) << "not zstd at all";
  fs::remove(tmp.path() / "out");
  EXPECT_FALSE(DecompressFile(tmp.path() / "junk", tmp.path() / "out", 1ull << 32).ok());
}

}  // namespace
}  // namespace hvtrace::hostd
