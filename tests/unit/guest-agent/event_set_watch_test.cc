// When the agent re-publishes formats: a module with events loaded or
// unloaded, a dynamic event added; not for use counts that change all the
// time, and once per change after it settled.
#include "event_set_watch.h"

#include <gtest/gtest.h>

namespace hvtrace::agent {
namespace {

constexpr char kModules[] =
    "pvpanic_mmio 12288 0 - Live 0xffffffffc0a00000\n"
    "pvpanic 12288 1 pvpanic_mmio, Live 0xffffffffc0900000\n";

TEST(EventSetSignatureTest, CountsLiveModuleNamesAndDynamicEventsOnly) {
  const uint64_t base = EventSetSignature(kModules, "");
  // Use counts, addresses and order of the same live modules: no change.
  EXPECT_EQ(base, EventSetSignature("pvpanic_mmio 12288 3 - Live 0xffffffffc0a00000\n"
                                    "pvpanic 12288 1 pvpanic_mmio, Live 0xffffffffc0900000\n",
                                    ""));
  // A module still loading does not count yet; once live it does.
  const std::string loading = std::string(kModules) + "hvt_alpha 16384 0 - Loading 0xffff\n";
  EXPECT_EQ(base, EventSetSignature(loading, ""));
  const std::string live = std::string(kModules) + "hvt_alpha 16384 0 - Live 0xffff\n";
  EXPECT_NE(base, EventSetSignature(live, ""));
  // A kprobe event added.
  EXPECT_NE(base, EventSetSignature(kModules, "p:kprobes/open do_sys_open\n"));
  EXPECT_EQ(EventSetSignature("", ""), EventSetSignature("garbage without spaces\n", ""));
}

TEST(EventSetWatchTest, ReportsEachChangeOnceAfterItSettled) {
  EventSetWatch watch(/*period_ns=*/1000, /*settle_ns=*/500);
  EXPECT_TRUE(watch.Due(0));
  EXPECT_FALSE(watch.Observe(1, 0));  // The baseline.
  EXPECT_FALSE(watch.Due(999));
  EXPECT_TRUE(watch.Due(1000));
  EXPECT_FALSE(watch.Observe(1, 1000));
  EXPECT_FALSE(watch.Observe(2, 2000));  // New, not settled yet.
  EXPECT_FALSE(watch.Observe(3, 2300));  // Changed again (insmod B after A).
  EXPECT_FALSE(watch.Observe(3, 2700));  // 400 ns: still settling.
  EXPECT_TRUE(watch.Observe(3, 2800));   // One report for both.
  EXPECT_FALSE(watch.Observe(3, 4000));  // Reported once.
  EXPECT_EQ(watch.changes(), 1u);
  // A change that went back before it settled is none.
  EXPECT_FALSE(watch.Observe(4, 5000));
  EXPECT_FALSE(watch.Observe(3, 5100));
  EXPECT_FALSE(watch.Observe(3, 9000));
  EXPECT_EQ(watch.changes(), 1u);
  // Back to the first set (the module unloaded): a change.
  EXPECT_FALSE(watch.Observe(1, 10000));
  EXPECT_TRUE(watch.Observe(1, 11000));
  EXPECT_EQ(watch.changes(), 2u);
}

}  // namespace
}  // namespace hvtrace::agent
