// The agent's "started" line in the persistent boot instance: written only
// into an instance that exists, never created.
#include "boot_marker.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace hvtrace::agent {
namespace {

namespace fs = std::filesystem;

class BootMarkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("hvt-boot-marker-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "instances");
  }
  void TearDown() override { fs::remove_all(root_); }

  static std::string Read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  fs::path root_;
};

TEST_F(BootMarkerTest, TextNamesThePid) {
  EXPECT_EQ(BootMarkerText(4242), "hvtrace-agent: started pid 4242");
}

TEST_F(BootMarkerTest, WritesOneLineIntoTheInstancesMarker) {
  fs::create_directories(root_ / "instances/boot_map");
  { std::ofstream(root_ / "instances/boot_map/trace_marker"); }
  EXPECT_TRUE(WriteBootMarker(root_.string(), "boot_map", BootMarkerText(7)));
  EXPECT_EQ(Read(root_ / "instances/boot_map/trace_marker"), "hvtrace-agent: started pid 7\n");
}

TEST_F(BootMarkerTest, NoInstanceNoWrite) {
  EXPECT_FALSE(WriteBootMarker(root_.string(), "boot_map", "x"));
  EXPECT_FALSE(fs::exists(root_ / "instances/boot_map"));
  // An instance without a trace_marker: nothing is made up.
  fs::create_directories(root_ / "instances/boot_map");
  EXPECT_FALSE(WriteBootMarker(root_.string(), "boot_map", "x"));
  EXPECT_FALSE(fs::exists(root_ / "instances/boot_map/trace_marker"));
}

TEST_F(BootMarkerTest, RefusesNamesThatAreNotOneInstance) {
  fs::create_directories(root_ / "instances/boot_map");
  { std::ofstream(root_ / "instances/boot_map/trace_marker"); }
  { std::ofstream(root_ / "trace_marker"); }
  for (const char* bad : {"", ".", "..", "../instances/boot_map", "boot_map/"}) {
    EXPECT_FALSE(WriteBootMarker(root_.string(), bad, "x")) << bad;
  }
  EXPECT_EQ(Read(root_ / "instances/boot_map/trace_marker"), "");
  EXPECT_EQ(Read(root_ / "trace_marker"), "");
}

}  // namespace
}  // namespace hvtrace::agent
