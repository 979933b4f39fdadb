// The region fixture the region capture tests share: a region as hvtraced
// and the agent fill it, with real kernel pages (this host's sched_switch
// fixture) on two CPUs and one direct-write ring written by a page writer.
#ifndef HVTRACE_TESTS_UNIT_REGION_CAPTURE_FIXTURE_H_
#define HVTRACE_TESTS_UNIT_REGION_CAPTURE_FIXTURE_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "capture_service.h"
#include "guest_region_setup.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/page.h"
#include "hvtrace/region_text.h"
#include "hvtrace/region_writer.h"
#include "hvtrace/tracedat.h"
#include "live_region.h"
#include "region_stream.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

using test_support::Bytes;
using test_support::ReadFixture;

// A direct-write event as programs register it (the dwtrace text shape).
constexpr uint32_t kDwId = region::kDwFirstEventId;
const char kDwFormat[] =
    "name: hvt_value\n"
    "ID: 49152\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;\n"
    "\n"
    "print fmt: \"value=%d\", REC->value\n";

struct DwPayload {
  uint16_t type;
  uint8_t flags;
  uint8_t preempt;
  int32_t pid;
  int32_t value;
  int32_t pad;
};

[[maybe_unused]] std::string Shell(const std::string& cmd) { return test_support::RunCommand(cmd); }

[[maybe_unused]] size_t Count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

// A region as hvtraced and the agent fill it: real kernel pages (this host's
// sched_switch fixture) on two CPUs and one direct-write ring with events
// written by a page writer, as the direct-write library does.
class RegionCaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegionPlanOptions opt;
    opt.max_cpus = 2;
    opt.region_id = 0xabc;
    opt.symbol_area_size = 64 << 10;  // Small regions get none by default.
    opt.comm_area_size = 8 << 10;
    auto plan = PlanRegion(1 << 20, opt);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    geometry_ = *plan;
    mem_.assign(geometry_.region_size, std::byte{0});
    ASSERT_TRUE(InitRegionHeader(mem_, geometry_, 42).ok());
    auto guest = GuestRegion::Attach(mem_.data(), mem_.size());
    ASSERT_TRUE(guest.ok()) << guest.error().message;
    guest->WriteIdentity(test_support::TestGuestIdentity());
    ASSERT_TRUE(test_support::PublishHeaderPage(*guest));
    ASSERT_TRUE(test_support::PublishEvent(*guest, region::kFormatKernelEvent, "sched",
                                           test_support::SchedSwitchFormat()));
    ASSERT_TRUE(
        test_support::PublishEvent(*guest, region::kFormatDwEvent, "hvtrace", kDwFormat, kDwId));
    for (int i = 0; i < 3; ++i) {
      guest->PushCpuPage(0, 1, Bytes(ReadFixture("pages/cpu0-" + std::to_string(i) + ".bin")), 0);
    }
    guest->PushCpuPage(1, 1, Bytes(ReadFixture("pages/cpu1-0.bin")), 0);
    guest_.emplace(*guest);
    WriteDwPage(0, 0, 5, 1000);
  }

  // Writes |n| events (values 0..n-1, times start, start+10, ...) as page
  // |sequence| of direct-write ring |ring|, published and closed.
  void WriteDwPage(uint32_t ring, uint64_t sequence, int n, uint64_t start, uint32_t generation = 1,
                   uint64_t step = 10) {
    region::DwRingHeader* h = guest_->dw_ring(ring);
    h->pid = 77;
    h->tid = 78;
    h->boot_generation = generation;
    h->clock = dw_clock_;
    std::strcpy(h->comm, "dwprog");
    const uint32_t slot = static_cast<uint32_t>(sequence % geometry_.dw_slots);
    std::span<std::byte> page(guest_->dw_page(ring, slot), geometry_.slot_size);
    std::fill(page.begin(), page.end(), std::byte{0});
    PageWriter w(page, PageLayout::Default(geometry_.slot_size), start);
    for (int i = 0; i < n; ++i) {
      DwPayload p{static_cast<uint16_t>(kDwId), 0, 0, 78, i, 0};
      ASSERT_TRUE(w.Append(start + step * static_cast<uint64_t>(i),
                           std::span(reinterpret_cast<const std::byte*>(&p), sizeof p)));
    }
    w.Finish();
    region::SlotDesc* d = guest_->dw_desc(ring, slot);
    d->seq = 2 * (sequence + 1);
    d->sequence = sequence;
    d->boot_generation = generation;
    d->length = 16 + w.used();
    d->flags = 0;
    d->clock = dw_clock_;
    h->published = sequence + 1;
  }

  RegionSnapshot Read() {
    auto snap = ReadRegion(mem_, geometry_);
    EXPECT_TRUE(snap.ok());
    return std::move(*snap);
  }

  fs::path TempDir() {
    dirs_.push_back(std::make_unique<test_support::TempDir>("region_capture_test"));
    EXPECT_FALSE(dirs_.back()->path().empty());
    return dirs_.back()->path();
  }

  uint32_t dw_clock_ = region::kClockMono;
  RegionGeometry geometry_;
  std::vector<std::byte> mem_;
  std::optional<GuestRegion> guest_;
  std::vector<std::unique_ptr<test_support::TempDir>> dirs_;
};

[[maybe_unused]] std::chrono::steady_clock::time_point T(int ms) {
  return std::chrono::steady_clock::time_point(std::chrono::milliseconds(ms));
}

}  // namespace
}  // namespace hvtrace::hostd

#endif  // HVTRACE_TESTS_UNIT_REGION_CAPTURE_FIXTURE_H_
