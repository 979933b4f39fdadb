// The timeline oracle's reading of trace-cmd's merged report (timeline_check.h),
// on lines as trace-cmd 3.1 prints them. A fresh suite run (2026-12-05) failed
// LibvirtDebianRelease/debian12 where the boot range had lost events: trace-cmd
// put the file's name before "CPU:0 [EVENTS DROPPED]", and the event after it
// came without one.
#include "timeline_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hvtrace::e2e {
namespace {

TEST(TimelineCheckTest, TheEventAfterDroppedOnesKeepsItsFile) {
  const std::string report =
      "                 host.dat:          qemu-7599  [000]1796464824837758000: "
      "virtio_set_status:    vdev=0x55590fd0ecc0 val=0\n"
      "    boot-0.host-clock.dat:           <idle>-0     [000]1796464830610714054: "
      "irq_handler_exit:     irq=0 ret=handled\n"
      "    boot-0.host-clock.dat: CPU:0 [EVENTS DROPPED]\n"
      "           <idle>-0     [000]1796464830851111434: irq_handler_entry:    irq=0 name=timer\n"
      "    boot-0.host-clock.dat: CPU:1 [12 EVENTS DROPPED]\n"
      "           <idle>-0     [001]1796464830851125410: irq_handler_exit:     irq=0 "
      "ret=handled\n"
      "    boot-0.host-clock.dat:           <idle>-0     [000]1796464830851130646: "
      "softirq_entry:        vec=9 [action=RCU]\n";
  std::vector<std::string> raw;
  EXPECT_EQ(TraceCmdOrder(report, &raw),
            (std::vector<std::string>{
                "host.dat virtio_set_status", "boot-0.host-clock.dat irq_handler_exit",
                "boot-0.host-clock.dat irq_handler_entry", "boot-0.host-clock.dat irq_handler_exit",
                "boot-0.host-clock.dat softirq_entry"}));
  EXPECT_EQ(raw.size(), 5u);
}

}  // namespace
}  // namespace hvtrace::e2e
