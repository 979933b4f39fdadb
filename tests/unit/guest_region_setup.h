// The guest's side of a test region as the agent sets it up at start: the
// identity of a 2-CPU test kernel at boot generation 1, and formats published
// with their fingerprints. One helper for the region tests of shared/core and
// hostd/decode, so they all describe the same guest.
#ifndef HVTRACE_TESTS_UNIT_GUEST_REGION_SETUP_H_
#define HVTRACE_TESTS_UNIT_GUEST_REGION_SETUP_H_

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"
#include "hvtrace/region_reader.h"
#include "hvtrace/region_writer.h"
#include "test_support.h"

namespace hvtrace::test_support {

// Kernel "6.12.9-test", 2 CPUs, mono clock, 4 KiB pages, boot generation 1.
inline region::GuestIdentity TestGuestIdentity() {
  region::GuestIdentity id{};
  id.boot_generation = 1;
  std::strcpy(id.kernel_release, "6.12.9-test");
  id.nr_cpus = 2;
  id.trace_clock = region::kClockMono;
  id.page_size = 4096;
  return id;
}

// Publishes this host's header_page fixture for boot generation 1.
inline testing::AssertionResult PublishHeaderPage(GuestRegion& guest) {
  auto r = guest.PublishFormat(region::kFormatHeaderPage, 1, 0, "ftrace",
                               ReadFixture("pages/header_page.txt"), 0);
  if (!r.ok()) return testing::AssertionFailure() << "header_page: " << r.error().message;
  return testing::AssertionSuccess();
}

// Publishes event format |text| of |system| as |kind| (kFormatKernelEvent or
// kFormatDwEvent) for boot generation 1, under |id| or, when |id| is 0, the
// format's own ID line; its fingerprint goes to |*fingerprint| when asked.
inline testing::AssertionResult PublishEvent(GuestRegion& guest, region::FormatKind kind,
                                             const std::string& system, const std::string& text,
                                             uint32_t id = 0, uint64_t* fingerprint = nullptr) {
  auto parsed = ParseEventFormat(system, text);
  if (!parsed.ok()) return testing::AssertionFailure() << system << ": " << parsed.error().message;
  const uint64_t fp = EventFingerprint(*parsed);
  if (fingerprint) *fingerprint = fp;
  auto r = guest.PublishFormat(kind, 1, id ? id : parsed->id, system, text, fp);
  if (!r.ok()) return testing::AssertionFailure() << parsed->name << ": " << r.error().message;
  return testing::AssertionSuccess();
}

// A guest thread that pushes |page| to CPU |cpu|'s ring as fast as it can,
// write i numbered i in its first and last 8 bytes, until destroyed: for
// tests that read a ring while the guest rewrites it.
class NumberedPageWriter {
 public:
  NumberedPageWriter(GuestRegion guest, uint32_t cpu, std::vector<std::byte> page)
      : thread_([this, guest, cpu, page]() mutable {
          for (uint64_t i = 0; !stop_.load(std::memory_order_relaxed); ++i) {
            std::memcpy(page.data(), &i, 8);
            std::memcpy(page.data() + page.size() - 8, &i, 8);
            guest.PushCpuPage(cpu, 1, page, 0);
            written_.store(i + 1, std::memory_order_relaxed);
          }
        }) {}
  ~NumberedPageWriter() {
    stop_ = true;
    thread_.join();
  }
  uint64_t written() const { return written_.load(); }
  // Whether |p| holds the write its descriptor's sequence names.
  static bool Matches(const RegionPage& p) {
    uint64_t head, tail;
    std::memcpy(&head, p.page.data(), 8);
    std::memcpy(&tail, p.page.data() + p.page.size() - 8, 8);
    return head == p.sequence && tail == p.sequence;
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> written_{0};
  std::thread thread_;  // Last: starts after the atomics exist.
};

// The sched_switch format of the boot_map fixture kernel.
inline std::string SchedSwitchFormat() {
  return ReadFixture("boot_map/formats/sched/sched_switch/format");
}

}  // namespace hvtrace::test_support

#endif  // HVTRACE_TESTS_UNIT_GUEST_REGION_SETUP_H_
