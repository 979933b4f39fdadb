// LiveRegion against a region file that shrinks under its mapping, as QEMU
// (whose user owns an attach region's file) or a local user with its uid can
// make it: every read and request write fails or is dropped, hvtraced lives.
#include "live_region.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "hvtrace/region.h"
#include "hvtrace/region_writer.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

class LiveRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LiveRegionOptions o;
    o.path = dir_.path() / "region";
    o.size_bytes = 1 << 20;
    auto region = LiveRegion::Create(o);
    ASSERT_TRUE(region.ok()) << region.error().message;
    region_ = *region;
    // The agent's announcement, so that Guest() has something to show.
    auto guest = GuestRegion::Attach(const_cast<std::byte*>(region_->data()), region_->size());
    ASSERT_TRUE(guest.ok()) << guest.error().message;
    region::GuestIdentity id{};
    id.boot_generation = 1;
    id.nr_cpus = 1;
    id.page_size = 4096;
    id.trace_clock = region::kClockMono;
    guest->WriteIdentity(id);
  }
  void Shrink(off_t to) { ASSERT_EQ(::truncate(region_->path().c_str(), to), 0); }

  test_support::TempDir dir_{"live-region-test"};
  std::shared_ptr<LiveRegion> region_;
};

TEST_F(LiveRegionTest, ReadsWorkWhileTheFileIsWhole) {
  auto reader = region_->NewReader();
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE(region_->Refresh(**reader).ok());
  EXPECT_TRUE((*reader)->Validate()->guest.present);
  EXPECT_TRUE(region_->Guest().present);
}

TEST_F(LiveRegionTest, Malicious_AFileCutShortIsAnErrorNotASigbus) {
  auto reader = region_->NewReader();
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE(region_->Refresh(**reader).ok());
  // The control area stays, the rings go: the stream's read fails.
  Shrink(64 << 10);
  Status s = region_->Refresh(**reader);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("shrank"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find(region_->path().string()), std::string::npos);
  EXPECT_TRUE(region_->Guest().present);
  // Nothing left: status shows no guest, requests are dropped.
  Shrink(0);
  EXPECT_FALSE(region_->Guest().present);
  region_->SetEvents("sched:sched_switch");
  region_->SetPumpInterval(10);
  region_->RequestSnapshot();
  std::vector<std::byte> copy;
  EXPECT_FALSE(region_->CopyInto(copy).ok());
}

TEST(LiveRegion, CreateWritesTheHeaderAndRefusesAnExistingFile) {
  const std::string path = "/tmp/live_region_test_create_" + std::to_string(::getpid());
  std::filesystem::remove(path);
  LiveRegionOptions o;
  o.path = path;
  o.size_bytes = 1 << 20;
  o.max_cpus = 2;
  o.events = "sched:sched_switch";
  o.pump_interval_ms = 25;
  auto r = LiveRegion::Create(o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(std::filesystem::file_size(path), 1u << 20);
  EXPECT_EQ((*r)->geometry().max_cpus, 2u);
  auto* req =
      reinterpret_cast<const region::HostRequests*>((*r)->data() + region::kHostRequestsOffset);
  EXPECT_EQ(req->pump_interval_ms, 25u);
  EXPECT_EQ(std::string(req->events, req->events_len), "sched:sched_switch");
  const uint64_t seq = req->request_seq;
  (*r)->SetEvents("irq:*");
  EXPECT_EQ(req->request_seq, seq + 1);
  EXPECT_EQ(std::string(req->events, req->events_len), "irq:*");

  // A second region on the same path is refused unless asked to replace.
  auto again = LiveRegion::Create(o);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find(path), std::string::npos);
  auto reopened = LiveRegion::OpenExisting(path);
  ASSERT_TRUE(reopened.ok()) << reopened.error().message;
  EXPECT_EQ((*reopened)->geometry(), (*r)->geometry());
  o.replace_existing = true;
  auto replaced = LiveRegion::Create(o);
  ASSERT_TRUE(replaced.ok()) << replaced.error().message;
  EXPECT_NE((*replaced)->geometry().region_id, (*r)->geometry().region_id);
  std::filesystem::remove(path);

  o.size_bytes = 3 << 20;
  auto odd = LiveRegion::Create(o);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.error().message.find("power of two"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace hvtrace::hostd
