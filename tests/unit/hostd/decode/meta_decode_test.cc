// Boot-range captures decoded with the metadata channel's boots: range boot
// i of B ↔ the VM's channel boot M - B + i (arrival order), each with its own
// formats, symbols and task names, and never another VM's metadata.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "boot_range_decode.h"
#include "capture_service.h"
#include "hostd/decode/capture_pipeline_fixture.h"
#include "hostd/meta/meta_fixture.h"
#include "hvtrace/tracedat.h"
#include "meta_store.h"

namespace hvtrace::hostd {
namespace {

using test_support::MetaBootMembers;
using test_support::TestBootId;
using test_support::UstarArchive;

class MetaDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hvtrace-meta-decode-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    region_ = Unzstd(kDir + "kexec/region.bin.zst");
    ASSERT_EQ(region_.size(), 16u << 20);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Stores channel boot |n| of the kexec fixture's kernel with |comms| in
  // VM |vm|'s meta dir.
  void AddChannelBoot(const std::string& vm, uint8_t n, const std::string& comms,
                      int64_t received_ns = 0) {
    MetaStore store(MetaDirOfVm(root_ / "vms" / vm));
    const meta::BootId id = TestBootId(n);
    Result<MetaBoot> boot = ValidateMetaBoot(id, UstarArchive(MetaBootMembers(kDir + "kexec", id)));
    ASSERT_TRUE(boot.ok()) << boot.error().message;
    ASSERT_TRUE(store.StoreBoot(*boot, {{"build_id", "verified"}}, received_ns).ok());
    ASSERT_TRUE(store.StoreComms(boot->boot_id, comms).ok());
  }

  struct Decoded {
    json formats;  // manifest extra.formats
    json boots;    // manifest extra.boots
    fs::path dir;
  };
  // Decodes the kexec fixture as a capture of VM |vm| with no kernel file
  // (an adopted, disk-booted VM).
  Decoded Decode(const std::string& vm, HostTime triggered = {}) {
    Decoded d;
    CaptureStore store(root_ / "vms" / vm / "captures");
    auto pending = store.Begin("panic", HostTime::Now());
    EXPECT_TRUE(pending.ok());
    if (!pending.ok()) return d;
    CaptureManifest manifest;
    manifest.vm = vm;
    manifest.trigger = "panic";
    manifest.triggered = triggered;
    DecodeBootRange(region_, {.meta_dir = MetaDirOfStore(store)}, (*pending)->dir(), manifest);
    d.formats = manifest.extra["formats"];
    d.boots = manifest.extra.value("boots", json::array());
    auto entry = (*pending)->Commit(std::move(manifest));
    EXPECT_TRUE(entry.ok()) << entry.error().message;
    if (entry.ok()) d.dir = entry->dir;
    return d;
  }

  fs::path root_;
  std::vector<std::byte> region_;
};

TEST_F(MetaDecodeTest, EachBootDecodesWithItsOwnChannelBoot) {
  // Pid 1 is named by the trace itself; 99999 never appears in it.
  AddChannelBoot("a", 1, "1 init-first-boot\n99999 agent-first\n");
  AddChannelBoot("a", 2, "1 init-second-boot\n99999 agent-second\n");
  Decoded d = Decode("a");
  ASSERT_EQ(d.formats["decoded"], true) << d.formats.dump(2);
  EXPECT_EQ(d.formats["meta"]["boots"], 2);
  ASSERT_EQ(d.boots.size(), 2u);
  for (uint32_t boot = 0; boot < 2; ++boot) {
    SCOPED_TRACE("boot " + std::to_string(boot));
    const json& with = d.boots[boot]["decoded_with"];
    EXPECT_EQ(with["from"], "meta channel");
    EXPECT_EQ(with["boot_id"], meta::BootIdString(TestBootId(static_cast<uint8_t>(boot + 1))));
    EXPECT_EQ(with["verified"]["build_id"], "verified");
    // The fixture's kallsyms are the second boot's (both channel boots here
    // carry them): the first boot's marker ip and tasklet callback lie
    // 0x1e400000 below them, which contradicts the channel's claim that they
    // are boot 0's own, so boot 0 prints raw; boot 1's evidence agrees.
    if (boot == 0) {
      EXPECT_EQ(with["kaslr"]["raw"], true) << with["kaslr"].dump();
    } else {
      EXPECT_EQ(with["kaslr"]["delta"], 0) << with["kaslr"].dump();
      EXPECT_EQ(with["kaslr"]["source"], "agent metadata");
    }
    const fs::path dat = d.dir / ("boot-" + std::to_string(boot) + ".trace.dat");
    Result<TraceDat> t = TraceDat::Open(dat.string());
    ASSERT_TRUE(t.ok()) << t.error().message;
    // Each boot's own channel comms fill in the pids its trace never names;
    // the others get the name covering most of their events (MostUsedNames).
    const std::string& cmdlines = t->cmdlines();
    EXPECT_TRUE(cmdlines.ends_with(boot == 0 ? "\n99999 agent-first\n" : "\n99999 agent-second\n"))
        << cmdlines.substr(0, 300);
    EXPECT_TRUE(cmdlines.starts_with("1 swapper/0\n")) << cmdlines.substr(0, 300);
    EXPECT_EQ(cmdlines.find("init-"), std::string::npos);
    // The fixture's kallsyms are the second boot's (both channel boots here
    // carry them): boot 1's evidence proves them, boot 0's contradicts them
    // and it prints raw.
    EXPECT_EQ(t->kallsyms().empty(), boot == 0);
    CmdRun report = RunCommand("trace-cmd report -i '" + dat.string() + "'");
    ASSERT_EQ(report.status, 0);
    size_t events = 0;
    for (const auto& [cpu, list] : ReportEvents(report.out, nullptr)) events += list.size();
    EXPECT_EQ(events, d.boots[boot]["events"].get<size_t>());
    EXPECT_NE(report.out.find("boot" + std::to_string(boot)), std::string::npos);
  }
}

TEST_F(MetaDecodeTest, AnOlderBootWithoutChannelMetadataBorrowsUnverified) {
  // The channel only saw the newest boot (the one that panicked).
  AddChannelBoot("a", 7, "1 init\n");
  Decoded d = Decode("a");
  ASSERT_EQ(d.formats["decoded"], true) << d.formats.dump(2);
  ASSERT_EQ(d.boots.size(), 2u);
  EXPECT_EQ(d.boots[1]["decoded_with"]["from"], "meta channel");
  EXPECT_EQ(d.boots[1]["decoded_with"]["boot_id"], meta::BootIdString(TestBootId(7)));
  EXPECT_EQ(d.boots[0]["decoded_with"]["from"], "meta channel (nearest boot)");
  EXPECT_THAT(d.boots[0]["decoded_with"]["symbols"].get<std::string>(),
              ::testing::HasSubstr("unverified"));
}

// The captured boot died before its agent sent anything: the newest channel
// boot arrived long before that boot began (trigger time less its last
// event's time), so it is the boot before, and the captured boot has none.
TEST_F(MetaDecodeTest, ANewestChannelBootOlderThanTheCapturedBootIsTheBootBefore) {
  const HostTime now = HostTime::Now();
  const int64_t hour = 3600'000'000'000ll;
  AddChannelBoot("a", 1, "1 init-older\n", now.realtime_ns - 2 * hour);
  AddChannelBoot("a", 2, "1 init-newest\n", now.realtime_ns - hour);
  Decoded d = Decode("a", now);
  ASSERT_EQ(d.formats["decoded"], true) << d.formats.dump(2);
  EXPECT_NE(d.formats["meta"].value("pairing", std::string()).find("taken as the boot before"),
            std::string::npos)
      << d.formats.dump(2);
  ASSERT_EQ(d.boots.size(), 2u);
  EXPECT_EQ(d.boots[0]["decoded_with"]["boot_id"], meta::BootIdString(TestBootId(2)));
  EXPECT_EQ(d.boots[1]["decoded_with"]["from"], "meta channel (nearest boot)");
  // Received during the captured boot: the usual pairing.
  fs::remove_all(root_ / "vms" / "a" / "meta");
  AddChannelBoot("a", 1, "1 init-older\n", now.realtime_ns - 2 * hour);
  AddChannelBoot("a", 2, "1 init-newest\n", now.realtime_ns - 1'000'000'000ll);
  d = Decode("a", now);
  EXPECT_FALSE(d.formats["meta"].contains("pairing")) << d.formats.dump(2);
  EXPECT_EQ(d.boots[1]["decoded_with"]["boot_id"], meta::BootIdString(TestBootId(2)));
  EXPECT_EQ(d.boots[0]["decoded_with"]["boot_id"], meta::BootIdString(TestBootId(1)));
}

TEST_F(MetaDecodeTest, AVmsMetadataNeverDecodesAnotherVmsCapture) {
  AddChannelBoot("a", 1, "1 init\n");
  AddChannelBoot("a", 2, "1 init\n");
  // VM b's captures look in b's meta dir only: none there, so b's capture
  // is counted, not decoded, though a's metadata would fit.
  EXPECT_EQ(MetaDirOfStore(CaptureStore(root_ / "vms" / "b" / "captures")),
            root_ / "vms" / "b" / "meta");
  Decoded d = Decode("b");
  EXPECT_EQ(d.formats["decoded"], false) << d.formats.dump(2);
  // It looked in b's directory only, and found nothing there.
  EXPECT_EQ(d.formats["meta"]["dir"], (root_ / "vms" / "b" / "meta").string());
  EXPECT_EQ(d.formats["meta"]["boots"], 0);
  EXPECT_FALSE(fs::exists(d.dir / "boot-0.trace.dat"));
  EXPECT_FALSE(fs::exists(root_ / "vms" / "b" / "meta"));
}

}  // namespace
}  // namespace hvtrace::hostd
