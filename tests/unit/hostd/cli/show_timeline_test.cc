// The event text `hvtrace show --timeline` prints: trace-cmd's line with its
// time stamp field taken out, as trace-cmd 3.1 (Debian 12) and 3.3 (Debian
// 13, the latency column run into the nanoseconds) print it.
#include "show_timeline.h"

#include <gtest/gtest.h>

namespace hvtrace::cli {
namespace {

TEST(ShowTimelineTest, TheTimeStampFieldOfBothTraceCmdReleasesIsTakenOut) {
  // trace-cmd 3.1: seconds.
  EXPECT_EQ(TimelineEventText("     qemu-9798  [000] 1795554630.485217: virtio_set_status: val=1"),
            "qemu-9798  [000] virtio_set_status: val=1");
  // trace-cmd 3.3 (a Debian 13 host, 2026-12-04): the latency column, then ns.
  EXPECT_EQ(TimelineEventText("<idle>-0     [000] d..1.1796406799009946109: console:              "
                              "NR_IRQS: 524544"),
            "<idle>-0     [000] console:              NR_IRQS: 524544");
  EXPECT_EQ(TimelineEventText("qemu-89593 [000] .....1796406794128114000: fw_cfg_read: = 0x0"),
            "qemu-89593 [000] fw_cfg_read: = 0x0");
  EXPECT_EQ(TimelineEventText("<idle>-0 [001] dN.4.1796406799641806577: sched_wakeup: m/1:24"),
            "<idle>-0 [001] sched_wakeup: m/1:24");
}

TEST(ShowTimelineTest, ALineWithoutATimeStampFieldIsKept) {
  EXPECT_EQ(TimelineEventText("  qemu-9798 [000] virtio_set_status: vdev=0x1 val=1"),
            "qemu-9798 [000] virtio_set_status: vdev=0x1 val=1");
  // An event name that ends in digits is no latency column and time stamp.
  EXPECT_EQ(TimelineEventText("task-1 [000] a1234567: x"), "task-1 [000] a1234567: x");
  EXPECT_EQ(TimelineEventText("no cpu field: x"), "no cpu field: x");
}

}  // namespace
}  // namespace hvtrace::cli
