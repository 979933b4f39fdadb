// LiveRegion against a region file that shrinks under its mapping, as QEMU
// (whose user owns an attach region's file) or a local user with its uid can
// make it: every read and request write fails or is dropped, hvtraced lives.
#include "live_region.h"

#include <gtest/gtest.h>
#include <unistd.h>

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

}  // namespace
}  // namespace hvtrace::hostd
