// Attach mode against a real 6.12 guest with a cold-plugged region: the host
// creates the region file (header and requests, as hvtraced will), the guest
// runs hvtrace-agent from its initramfs, writes markers through trace_marker
// and through the direct-write library (hvtrace-guest-test dw-write), and the host
// region reader finds all of them, in time order, without a single issue.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "attach_region_host.h"
#include "guest_harness.h"
#include "hvtrace/region_reader.h"

namespace hvtrace::e2e {
namespace {

using Clock = std::chrono::steady_clock;

struct Found {
  bool seen = false;
  uint64_t ts = 0;
};

bool Contains(std::span<const std::byte> payload, const std::string& needle) {
  const std::string_view hay(reinterpret_cast<const char*>(payload.data()), payload.size());
  return hay.find(needle) != std::string_view::npos;
}

TEST(AttachColdE2e, MarkersAndDirectWritesReachTheHostRegion) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "hvtrace-agent not built";
  }
  auto image = ImageWithThisAgent();
  ASSERT_TRUE(image.ok()) << image.error().message;

  TestGuest guest("attach-cold");
  const std::string path = guest.ShmPath("region");
  const uint64_t size = 4 * hostd::kMiB;
  RegionPlanOptions opt;
  opt.max_cpus = 2;
  opt.region_id = 0xa77ac4;
  auto geometry = PlanRegion(size, opt);
  ASSERT_TRUE(geometry.ok()) << geometry.error().message;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED);
  auto* host = static_cast<std::byte*>(map);
  struct Cleanup {
    void* map;
    uint64_t size;
    std::string path;
    ~Cleanup() {
      munmap(map, size);
      unlink(path.c_str());
    }
  } cleanup{map, size, path};
  ASSERT_TRUE(InitRegionHeader({host, size}, *geometry, 1).ok());
  auto* requests = reinterpret_cast<region::HostRequests*>(host + region::kHostRequestsOffset);
  requests->pump_interval_ms = 50;

  hostd::VmConfig config = guest.MakeConfig(*image);
  config.ivshmem.push_back({"ivs0", path, size, false});
  auto booted = guest.Boot(config);
  ASSERT_TRUE(booted.ok()) << booted.error().message << guest.Diagnostics();

  auto started = guest.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)");
  ASSERT_TRUE(started.ok()) << started.error().message;
  auto read = [&]() {
    std::vector<std::byte> copy;
    CopyLiveRegion(host, *geometry, &copy);
    return ReadRegion(std::move(copy), *geometry);
  };
  const auto attach_deadline = Clock::now() + std::chrono::seconds(30);
  while (true) {
    auto s = read();
    ASSERT_TRUE(s.ok());
    if (s->guest.present && s->guest.status.state == region::kStateRunning) {
      EXPECT_EQ(s->guest.kernel_release, image->release);
      EXPECT_EQ(s->guest.boot_generation, 1u);
      EXPECT_EQ(s->guest.nr_cpus, 2u);
      EXPECT_EQ(s->guest.trace_clock, region::kClockMono);
      break;
    }
    ASSERT_LT(Clock::now(), attach_deadline)
        << "agent never announced the guest\n"
        << guest.Run("cat /tmp/agent.log")->output << guest.Diagnostics();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  ASSERT_EQ(
      guest.Run("echo HVT-KMARK-1 > /sys/kernel/tracing/instances/hvtrace/trace_marker")->status,
      0);
  auto dw = guest.Run("hvtrace-guest-test dw-write --count 3 HVT-DW");
  ASSERT_TRUE(dw.ok());
  ASSERT_EQ(dw->status, 0) << dw->output;
  ASSERT_EQ(
      guest.Run("echo HVT-KMARK-2 > /sys/kernel/tracing/instances/hvtrace/trace_marker")->status,
      0);

  Found k1, k2, d[3];
  uint64_t issues = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline && !(k1.seen && k2.seen && d[0].seen && d[1].seen && d[2].seen)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto s = read();
    ASSERT_TRUE(s.ok());
    issues = s->issue_total();
    for (const RegionRing& ring : s->cpus) {
      for (const RegionPage& page : ring.pages) {
        PageStats stats;
        WalkPage(page.page, s->cpu_layout, &stats, [&](const RawRecord& r) {
          if (Contains(r.payload, "HVT-KMARK-1")) k1 = {true, r.timestamp};
          if (Contains(r.payload, "HVT-KMARK-2")) k2 = {true, r.timestamp};
        });
      }
    }
    for (const RegionRing& ring : s->dw_rings) {
      for (const RegionPage& page : ring.pages) {
        PageStats stats;
        WalkPage(page.page, s->dw_layout, &stats, [&](const RawRecord& r) {
          uint16_t type;
          std::memcpy(&type, r.payload.data(), 2);
          const RegionFormat* f = s->FindFormat(page.boot_generation, type);
          if (f == nullptr || f->parsed->name != "marker") return;
          for (int i = 0; i < 3; ++i) {
            if (Contains(r.payload, "HVT-DW " + std::to_string(i))) d[i] = {true, r.timestamp};
          }
        });
      }
    }
  }
  EXPECT_TRUE(k1.seen && k2.seen) << "trace_marker events missing\n"
                                  << guest.Run("cat /tmp/agent.log")->output;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(d[i].seen) << "direct-write event " << i << " missing";
  EXPECT_EQ(issues, 0u);
  // One clock (mono) on both paths: the order the guest wrote them in.
  EXPECT_LT(k1.ts, d[0].ts);
  EXPECT_LT(d[0].ts, d[1].ts);
  EXPECT_LT(d[1].ts, d[2].ts);
  EXPECT_LT(d[2].ts, k2.ts);
  std::printf("attach (cold): marker 1 @%llu, dw %llu..%llu, marker 2 @%llu (guest mono ns)\n",
              static_cast<unsigned long long>(k1.ts), static_cast<unsigned long long>(d[0].ts),
              static_cast<unsigned long long>(d[2].ts), static_cast<unsigned long long>(k2.ts));
}

}  // namespace
}  // namespace hvtrace::e2e
