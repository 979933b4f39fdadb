// The Debian 12 disk image (qemu-scripts/build-debian-image.sh) boots under
// QEMU from its own disk: syslinux, Debian's kernel and initramfs-tools
// initrd, systemd. The agent runs from the initramfs (guest-agent/dist's
// initramfs-tools hook), hands over before switch_root, and systemd starts
// hvtrace-agent.service; the demo marker service writes its trace_marker
// line; the guest powers off on the ACPI button.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <string>

#include "disk_guest.h"
#include "guest_harness.h"

namespace hvtrace::e2e {
namespace {

using Clock = std::chrono::steady_clock;

// A systemd boot under TCG with other guests on two cores: ~50 s alone.
constexpr std::chrono::milliseconds kDiskBootTimeout = 300s;

std::string RegexEscape(const std::string& text) {
  static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
  return std::regex_replace(text, special, R"(\$&)");
}

TEST(DebianImageE2eTest, BootsStartsAgentUnitAndDemoMarkerThenPowersOff) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) {
    GTEST_SKIP() << "QEMU cannot run here: " << why;
  }
  std::string skip_reason;
  auto image = FindDebianImage(&skip_reason);
  if (!skip_reason.empty()) GTEST_SKIP() << skip_reason;
  ASSERT_TRUE(image.ok()) << image.error().message;

  DiskGuest guest("deb");
  const auto started = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - started).count(); };
  auto step = [&](const char* what, const std::regex& pattern) {
    auto line = guest.console().WaitForMatch(pattern, kDiskBootTimeout);
    EXPECT_TRUE(line.ok()) << what << ": " << (line.ok() ? "" : line.error().message) << "\n"
                           << guest.Diagnostics();
    if (line.ok()) std::printf("[debian-image] %6.1f s  %s\n", seconds(), what);
    return line.ok();
  };
  ASSERT_TRUE(guest.Boot(*image).ok()) << guest.Diagnostics();

  // In boot order; each wait starts after the line the previous one matched.
  ASSERT_TRUE(step("kernel booted", std::regex("Linux version " + RegexEscape(image->release))));
  ASSERT_TRUE(step("agent started in the initramfs",
                   std::regex("^hvtrace-agent: started in the initramfs \\(pid [0-9]+\\)")));
  ASSERT_TRUE(step("initramfs agent stopped before switch_root",
                   std::regex("hvtrace-agent: stopped in the initramfs")));
  ASSERT_TRUE(step("systemd running", std::regex("systemd\\[1\\]: systemd [0-9]+")));
  ASSERT_TRUE(
      step("hvtrace-agent.service started", std::regex("Started .*hvtrace-agent\\.service")));
  ASSERT_TRUE(step("demo marker written",
                   std::regex("hvtrace-demo-marker: marker written to "
                              "/sys/kernel/tracing/instances/hvtrace/trace_marker")));
  ASSERT_TRUE(
      step("multi-user.target reached", std::regex("Reached target .*multi-user\\.target")));

  const std::string log = guest.ConsoleLog();
  // The agent of the unit speaks on the console (StandardError=journal+console).
  EXPECT_TRUE(std::regex_search(log, std::regex("hvtrace-agent\\[[0-9]+\\]: hvtrace-agent: ")))
      << "no line of the unit's agent on the console\n"
      << guest.Diagnostics();
  EXPECT_EQ(log.find("FAILED"), std::string::npos) << "a unit failed\n" << guest.Diagnostics();
  EXPECT_EQ(log.find("emergency"), std::string::npos) << guest.Diagnostics();
  EXPECT_EQ(log.find("still running 5 s after SIGTERM"), std::string::npos)
      << "the initramfs agent ignored SIGTERM\n"
      << guest.Diagnostics();

  const double before_poweroff = seconds();
  ASSERT_TRUE(guest.PowerOff(120s).ok()) << guest.Diagnostics();
  std::printf("[debian-image] %6.1f s  powered off (%.1f s after system_powerdown)\n", seconds(),
              seconds() - before_poweroff);
}

}  // namespace
}  // namespace hvtrace::e2e
