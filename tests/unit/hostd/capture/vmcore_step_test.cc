// The vmcore step over dumpers standing in for QEMU's dump-guest-memory:
// the file moves into the capture as `vmcore` (listed, so uploaded), and a
// dumper that fails or is missing is said in the manifest, never fatal.
#include "vmcore_step.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_support::ReadText;
using test_support::TempDir;

// A capture being made, in a directory of its own.
class VmcoreStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pending_ = store_.Begin("panic", HostTime::Now());
    ASSERT_TRUE(pending_.ok());
  }
  TempDir tmp_;
  CaptureStore store_{tmp_.path() / "captures"};
  Result<std::unique_ptr<PendingCapture>> pending_ = Error{"not begun"};
};

TEST_F(VmcoreStepTest, TheDumpMovesIntoTheCaptureAndIsListed) {
  auto& pending = pending_;
  TempDir& tmp = tmp_;
  CaptureInputs in;
  const fs::path elsewhere = tmp.path() / "qemu-wrote.vmcore";  // Another directory.
  in.dump_guest_memory = [&](const fs::path&) -> Result<fs::path> {
    std::ofstream(elsewhere) << "KDUMP   pretend";
    return elsewhere;
  };
  CaptureManifest m;
  m.vm = "vm1";
  m.trigger = "panic";
  VmcoreStep(in, **pending, m);
  const json& v = m.extra["vmcore"];
  EXPECT_FALSE(v.contains("error")) << v.dump();
  EXPECT_EQ(v["file"], "vmcore");
  EXPECT_EQ(v["bytes"], 15u);
  EXPECT_TRUE(m.extra["timing_ms"].contains("vmcore"));
  EXPECT_FALSE(fs::exists(elsewhere));
  auto entry = (*pending)->Commit(m);
  ASSERT_TRUE(entry.ok()) << entry.error().message;
  EXPECT_EQ(ReadText(entry->dir / "vmcore"), "KDUMP   pretend");
  const json doc = json::parse(ReadText(entry->dir / "manifest.json"));
  bool listed = false;
  for (const json& f : doc["files"]) listed |= f.dump().find("\"vmcore\"") != std::string::npos;
  EXPECT_TRUE(listed) << doc["files"].dump();
}

TEST_F(VmcoreStepTest, AFailedOrMissingDumperIsSaidInTheManifest) {
  auto& pending = pending_;
  CaptureInputs in;
  in.dump_guest_memory = [](const fs::path&) -> Result<fs::path> {
    return Error{"QMP dump-guest-memory: no space"};
  };
  CaptureManifest m;
  VmcoreStep(in, **pending, m);
  EXPECT_EQ(m.extra["vmcore"]["error"], "QMP dump-guest-memory: no space");
  EXPECT_FALSE(fs::exists((*pending)->dir() / "vmcore"));
  in.dump_guest_memory = nullptr;
  in.dump_unavailable = true;
  VmcoreStep(in, **pending, m);
  EXPECT_NE(m.extra["vmcore"]["error"].get<std::string>().find("cannot dump"), std::string::npos);
}

}  // namespace
}  // namespace hvtrace::hostd
