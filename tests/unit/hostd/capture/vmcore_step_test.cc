// The vmcore step over dumpers standing in for QEMU's dump-guest-memory:
// the file moves into the capture as `vmcore` (listed, so uploaded), and a
// dumper that fails or is missing is said in the manifest, never fatal.
#include "vmcore_step.h"

#include <gtest/gtest.h>

#include <cstring>
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

// QEMU 7.2's output: the flattened stream of a kdump file whose sub-header
// phys_base is the guest's decimal NUMBER(phys_base) read as hex.
std::string FlattenedKdump(uint64_t qemu_phys_base, const std::string& vmcoreinfo) {
  std::string kdump(8192, '\0');
  std::memcpy(kdump.data(), "KDUMP   ", 8);
  const uint32_t block = 4096;
  std::memcpy(kdump.data() + 428, &block, 4);
  std::memcpy(kdump.data() + 4096, &qemu_phys_base, 8);
  const uint64_t offset = kdump.size(), size = vmcoreinfo.size();
  std::memcpy(kdump.data() + 4096 + 32, &offset, 8);
  std::memcpy(kdump.data() + 4096 + 40, &size, 8);
  kdump += vmcoreinfo;
  auto be = [](int64_t v) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i)
      out[i] = static_cast<char>(static_cast<uint64_t>(v) >> (56 - 8 * i));
    return out;
  };
  std::string flat(4096, '\0');
  std::memcpy(flat.data(), "makedumpfile", 12);
  flat.replace(16, 8, be(1));
  flat.replace(24, 8, be(1));
  // Two records, the second first: a record is written at its offset.
  flat += be(4096) + be(static_cast<int64_t>(kdump.size() - 4096)) + kdump.substr(4096);
  flat += be(0) + be(4096) + kdump.substr(0, 4096);
  flat += be(-1) + be(-1);
  return flat;
}

// The step run on a flattened dump of |flat|'s bytes; its manifest entry.
json StepOnFlattened(const fs::path& dir, PendingCapture& pending, const std::string& flat_bytes,
                     CaptureManifest& m) {
  const fs::path flat = dir / "flat.vmcore";
  std::ofstream(flat, std::ios::binary) << flat_bytes;
  CaptureInputs in;
  in.dump_guest_memory = [&](const fs::path&) -> Result<fs::path> { return flat; };
  VmcoreStep(in, pending, m);
  return m.extra["vmcore"];
}

TEST_F(VmcoreStepTest, AFlattenedDumpIsReassembledAndItsPhysBaseFixed) {
  CaptureManifest m;
  const json v = StepOnFlattened(
      tmp_.path(), **pending_,
      FlattenedKdump(0x603979776ull, "OSRELEASE=6.12\nNUMBER(phys_base)=603979776\n"), m);
  ASSERT_FALSE(v.contains("error")) << v.dump();
  EXPECT_EQ(v["reassembled"], true);
  EXPECT_EQ(v["phys_base_fixed"]["kernel"], 603979776u) << v.dump();
  const std::string out = ReadText((*pending_)->dir() / "vmcore");
  ASSERT_GE(out.size(), 8192u);
  EXPECT_EQ(out.substr(0, 8), "KDUMP   ");
  uint64_t phys_base = 0;
  std::memcpy(&phys_base, out.data() + 4096, 8);
  EXPECT_EQ(phys_base, 603979776u);
  EXPECT_NE(out.find("NUMBER(phys_base)=603979776"), std::string::npos);
}

// Debian's 7.3 under KASLR, loaded below its link-time address: the kernel
// prints phys_base negative (%ld), QEMU 7.2 read "-140509184" as hex.
TEST_F(VmcoreStepTest, ANegativePhysBaseIsWrittenAsTheU64ItWrapsTo) {
  CaptureManifest m;
  const json v = StepOnFlattened(
      tmp_.path(), **pending_,
      FlattenedKdump(0xfffffffebfaf6e7cull, "OSRELEASE=7.3\nNUMBER(phys_base)=-140509184\n"), m);
  ASSERT_FALSE(v.contains("error")) << v.dump();
  EXPECT_FALSE(v.contains("phys_base_unchecked")) << v.dump();
  const std::string out = ReadText((*pending_)->dir() / "vmcore");
  ASSERT_GE(out.size(), 8192u);
  int64_t phys_base = 0;
  std::memcpy(&phys_base, out.data() + 4096, 8);
  EXPECT_EQ(phys_base, -140509184);
}

TEST_F(VmcoreStepTest, Malicious_ATruncatedFlattenedDumpIsAnError) {
  const fs::path flat = tmp_.path() / "flat.vmcore";
  std::string bytes = FlattenedKdump(1, "NUMBER(phys_base)=1\n");
  bytes.resize(bytes.size() - 100);
  std::ofstream(flat, std::ios::binary) << bytes;
  CaptureInputs in;
  in.dump_guest_memory = [&](const fs::path&) -> Result<fs::path> { return flat; };
  CaptureManifest m;
  VmcoreStep(in, **pending_, m);
  EXPECT_TRUE(m.extra["vmcore"].contains("error")) << m.extra["vmcore"].dump();
  EXPECT_FALSE(fs::exists((*pending_)->dir() / "vmcore"));
}

}  // namespace
}  // namespace hvtrace::hostd
