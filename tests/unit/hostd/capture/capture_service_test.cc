#include "capture_service.h"

#include "region_capture_fixture.h"

namespace hvtrace::hostd {
namespace {

// run's recovery, as a boot range's is, with the same trace.dat files.
TEST_F(RegionCaptureTest, AttachCaptureThatDiesAfterItsCopyIsRecovered) {
  const fs::path dir = TempDir();
  const fs::path region_file = dir / "region";
  {
    std::ofstream out(region_file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(mem_.data()),
              static_cast<std::streamsize>(mem_.size()));
  }
  auto live = LiveRegion::OpenExisting(region_file);
  ASSERT_TRUE(live.ok()) << live.error().message;
  CaptureStore store(dir / "captures");
  // "Dies": the hook stops the capture with an exception once its copy is
  // durable; the hidden directory survives the unwinding, as it would
  // survive SIGKILL.
  CaptureFaults faults;
  faults.after_copies_durable = [] { throw std::runtime_error("killed"); };
  CaptureRequest request;
  request.vm = "vm1";
  request.trigger = "panic";
  request.triggered = HostTime::Now();
  request.inputs.attach = *live;
  request.inputs.vcpus_stopped = true;
  request.inputs.transport = {{"kind", "libvirt"}, {"domain", "vm1"}};
  CaptureService dying(nullptr, 1, faults);
  EXPECT_THROW((void)dying.Take(store, request), std::runtime_error);
  auto left = store.ListIncomplete();
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 1u);
  EXPECT_TRUE(fs::exists((*left)[0] / "attach-region.bin"));
  EXPECT_TRUE(fs::exists((*left)[0] / std::string(kRecoveryRecordName)));

  auto report = CaptureService(nullptr, 1).Recover(store);
  ASSERT_TRUE(report.ok()) << report.error().message;
  ASSERT_EQ(report->recovered.size(), 1u) << (report->removed.empty() ? "" : report->removed[0]);
  const fs::path done = report->recovered[0].dir;
  EXPECT_TRUE(fs::exists(done / "attach-region.bin"));
  EXPECT_TRUE(fs::exists(done / "region-gen-1.trace.dat"));
  std::ifstream in(done / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  EXPECT_TRUE(m["recovered"].is_object()) << m.dump(2);
  EXPECT_EQ(m["region"]["kind"], "attach");
  EXPECT_EQ(m["extra"]["transport"]["kind"], "libvirt");
  EXPECT_EQ(m["extra"]["consistency"]["vcpus_stopped"], true);
  EXPECT_EQ(m["kernel"]["release"], "6.12.9-test");

  // The same capture taken without dying gives the same files.
  auto whole = CaptureService(nullptr, 1).Take(CaptureStore(dir / "whole"), request);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  EXPECT_EQ(test_support::ReadText(done / "region-gen-1.trace.dat").size(),
            test_support::ReadText(dir / "whole" / whole->id / "region-gen-1.trace.dat").size());
}

// A daemon that restarts and finds an attach-only guest still in the panic
// it captured names that capture instead of taking a second one; once the
// guest wrote anything, it is a new panic.
TEST_F(RegionCaptureTest, AnAttachOnlyGuestStillInTheSamePanicIsNotCapturedTwice) {
  const fs::path dir = TempDir();
  const fs::path region_file = dir / "region";
  {
    std::ofstream out(region_file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(mem_.data()),
              static_cast<std::streamsize>(mem_.size()));
  }
  auto live = LiveRegion::OpenExisting(region_file);
  ASSERT_TRUE(live.ok()) << live.error().message;
  CaptureStore store(dir / "captures");
  CaptureRequest request;
  request.vm = "vm1";
  request.trigger = "panic";
  request.triggered = HostTime::Now();
  request.inputs.attach = *live;
  CaptureService service(nullptr, 1);
  auto first = service.Take(store, request);
  ASSERT_TRUE(first.ok()) << first.error().message;

  request.trigger = "panic-while-away";
  request.dedupe_same_panic = true;
  auto again = service.Take(store, request);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_TRUE(again->deduplicated);
  EXPECT_EQ(again->id, first->id);
  EXPECT_EQ(store.List()->size(), 1u);

  {  // The guest ran again and wrote one byte of a page.
    std::fstream io(region_file, std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(static_cast<std::streamoff>(mem_.size() - 1));
    io.put('\x5a');
  }
  auto second = service.Take(store, request);
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_FALSE(second->deduplicated);
  EXPECT_EQ(store.List()->size(), 2u);
}

}  // namespace
}  // namespace hvtrace::hostd
