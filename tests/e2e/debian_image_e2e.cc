// The Debian disk images (qemu-scripts/build-debian-image.sh: Debian 12 with
// bookworm-backports' 6.12, Debian 13 with trixie-backports' 7.3) boot under
// QEMU from their own disk: syslinux, Debian's kernel and initramfs-tools
// initrd, systemd. The agent runs from the initramfs (guest-agent/dist's
// initramfs-tools hook), hands over before switch_root, and systemd starts
// hvtrace-agent.service, whose hardening still lets the agent map the
// cold-plugged ivshmem region (it announces itself in it); the demo marker
// service writes its trace_marker line; the guest powers off on the ACPI
// button. In the same boot, the agent's metadata channel (a virtio-serial
// port named org.hvtrace.agent.0 whose host end is a socket the test
// connects to, as hvtraced does): the boot archive, task names and clock
// samples, and everything again for a host that disconnects and comes back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "attach_region_host.h"
#include "disk_guest.h"
#include "guest_harness.h"
#include "meta_host.h"

namespace hvtrace::e2e {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A systemd boot under TCG with other guests on two cores: ~50 s alone.
constexpr std::chrono::milliseconds kDiskBootTimeout = 300s;

std::string RegexEscape(const std::string& text) {
  static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
  return std::regex_replace(text, special, R"(\$&)");
}

// The text of the first trace_marker event in |s|'s CPU pages whose `buf`
// holds |needle|, decoded as the guest kernel wrote it: the record's event
// id is looked up in the format table the agent published for the page's
// boot, that format must be ftrace's `print`, and the text is read from its
// `buf` field at the offset the guest kernel's format gives (not found by
// searching the record's bytes).
std::optional<std::string> DecodedMarker(const RegionSnapshot& s, const std::string& needle) {
  for (const RegionRing& ring : s.cpus) {
    for (const RegionPage& page : ring.pages) {
      std::optional<std::string> found;
      PageStats stats;
      WalkPage(page.page, s.cpu_layout, &stats, [&](const RawRecord& r) {
        if (found || r.payload.size() < 2) return;
        uint16_t type = 0;
        std::memcpy(&type, r.payload.data(), 2);
        const RegionFormat* format = s.FindFormat(page.boot_generation, type);
        if (format == nullptr || !format->parsed || format->system != "ftrace" ||
            format->parsed->name != "print") {
          return;
        }
        const FieldFormat* buf = format->parsed->FindField("buf");
        if (buf == nullptr || buf->offset >= r.payload.size()) return;
        std::string text(reinterpret_cast<const char*>(r.payload.data()) + buf->offset,
                         r.payload.size() - buf->offset);
        text = text.substr(0, text.find('\0'));
        if (text.find(needle) != std::string::npos) found = text;
      });
      if (found) return found;
    }
  }
  return std::nullopt;
}

// The metadata channel of a booted image: the unit's agent says on the
// console what its boot archive holds; the first connection got a kBoot (this
// boot's id, as the demo service prints it) and task names; a host that goes
// and comes back (a daemon restart) gets kBoot first again (sequence 0, then
// in order), kComms and kClock, from the unit's agent: the initramfs one is
// long gone.
void CheckMetaChannel(DiskGuest& guest, MetaHost& host, const DiskImage& image,
                      const std::function<double()>& seconds) {
  auto unit_line = guest.console().WaitForMatch(
      std::regex("hvtrace-agent\\[[0-9]+\\]: hvtrace-agent: (boot archive: .*)"), kDiskBootTimeout);
  ASSERT_TRUE(unit_line.ok()) << unit_line.error().message << "\n" << guest.Diagnostics();
  std::printf("[debian-image] %6.1f s  unit agent: %s\n", seconds(), (*unit_line)[1].c_str());
  // The demo service prints it before or after the agent's line: searched
  // in the whole console log, not after the last match.
  std::string boot_id;
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::smatch m;
        const std::string log = guest.ConsoleLog();
        if (!std::regex_search(log, m, std::regex("hvtrace-demo-marker: boot_id ([0-9a-f-]{36})")))
          return false;
        boot_id = m[1];
        return true;
      },
      kDiskBootTimeout))
      << "the demo service never printed the boot id\n"
      << guest.Diagnostics();
  ASSERT_TRUE(host.ReadUntil(
      [&] { return host.Find(meta::MetaType::kBoot) && host.Find(meta::MetaType::kComms); }, 120s))
      << "frames: " << host.frames.size() << "\n"
      << guest.Diagnostics();
  EXPECT_EQ(meta::BootIdString(host.Find(meta::MetaType::kBoot)->boot_id), boot_id);

  // A daemon restart: the agent may see no hangup in between (then our
  // hello tells it to send its boot archive again).
  host.Disconnect();
  usleep(500000);
  ASSERT_TRUE(host.Connect(10s));
  const double reconnected = seconds();
  ASSERT_TRUE(host.ReadUntil(
      [&] {
        return host.Find(meta::MetaType::kBoot) && host.Find(meta::MetaType::kComms) &&
               host.Find(meta::MetaType::kClock);
      },
      120s))
      << "frames after reconnecting: " << host.frames.size()
      << ", decoder errors: " << host.errors.size()
      << (host.errors.empty() ? "" : ", the last: " + host.errors.back()) << "\n"
      << guest.Diagnostics();
  // The quick reconnect may go unseen by the guest's kernel (no hangup):
  // frames the agent wrote before it read our hello reach us first, then
  // the boot archive starts its sequence again.
  size_t first_boot = 0;
  while (host.frames[first_boot].type != meta::MetaType::kBoot) ++first_boot;
  std::printf("[debian-image] %zu frame(s) of the old stream before the boot archive\n",
              first_boot);
  const meta::MetaFrame& boot = host.frames[first_boot];
  EXPECT_EQ(boot.sequence, 0u);
  EXPECT_EQ(meta::BootIdString(boot.boot_id), boot_id);
  std::printf(
      "[debian-image] %6.1f s  after reconnecting: kBoot %zu bytes raw, %llu on the wire "
      "(%.1f s after the reconnect)\n",
      seconds(), boot.payload.size(), static_cast<unsigned long long>(host.boot_wire),
      seconds() - reconnected);
  const bool hello_seen =
      guest.console().WaitForMatch(std::regex("a new host on .* \\(its hello came"), 5s).ok();
  std::printf("[debian-image] the agent %s\n",
              hello_seen ? "saw no hangup and took our hello for a new host"
                         : "saw the hangup (or has not logged the hello yet)");
  const std::string identity = CheckBootArchive(boot, image);
  EXPECT_EQ(JsonField(identity, "boot_id"), boot_id);
  // "pid comm" lines; the kernel may have saved few names yet, and the agent
  // still sends the list.
  const meta::MetaFrame* comms = host.Find(meta::MetaType::kComms);
  std::istringstream lines(comms->payload);
  const std::regex pid_comm("[0-9]+ .+");
  for (std::string line; std::getline(lines, line);)
    EXPECT_TRUE(std::regex_match(line, pid_comm)) << line;
  std::printf("[debian-image] kComms: %zu bytes\n", comms->payload.size());
  EXPECT_NE(host.Find(meta::MetaType::kClock)->payload.find("\"tsc\": "), std::string::npos);
  for (size_t i = first_boot; i < host.frames.size(); ++i)
    EXPECT_EQ(host.frames[i].sequence, i - first_boot);
}

class DebianImageE2eTest : public ::testing::TestWithParam<DebianRelease> {};

TEST_P(DebianImageE2eTest, BootsAgentUnitAttachesRegionDemoMarkerThenPowersOff) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) {
    GTEST_SKIP() << "QEMU cannot run here: " << why;
  }
  std::string skip_reason;
  auto image = FindDebianImage(&skip_reason, GetParam());
  if (!skip_reason.empty()) GTEST_SKIP() << skip_reason;
  ASSERT_TRUE(image.ok()) << image.error().message;
  std::printf("[debian-image] %s, kernel %s\n", GetParam().guest.c_str(), image->release.c_str());

  DiskGuest guest(GetParam().guest);
  const auto started = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - started).count(); };
  auto step = [&](const char* what, const std::regex& pattern) {
    auto line = guest.console().WaitForMatch(pattern, kDiskBootTimeout);
    EXPECT_TRUE(line.ok()) << what << ": " << (line.ok() ? "" : line.error().message) << "\n"
                           << guest.Diagnostics();
    if (line.ok()) std::printf("[debian-image] %6.1f s  %s\n", seconds(), what);
    return line.ok();
  };
  // A region created as hvtraced creates it, cold-plugged: the agents (the
  // initramfs one, then the unit's) find it at boot.
  // 16 MiB: its symbol area (region/16) holds the symbols of Debian's kernel
  // with the modules udev loads (~0.8 MiB compressed; 8 MiB is too small).
  constexpr uint64_t kRegionSize = 16ull << 20;
  const std::string region_path =
      "/dev/shm/hvt-" + GetParam().guest + "-region-" + std::to_string(getpid());
  auto region = HostRegion::Create(region_path, kRegionSize, 2, 0xdeb12001, 200, "");
  ASSERT_TRUE(region.ok()) << region.error().message;
  const std::string sock =
      "/tmp/hvt-meta-" + GetParam().guest + "-" + std::to_string(getpid()) + ".sock";
  unlink(sock.c_str());
  std::vector<std::string> qemu_args = {
      "-object",
      "memory-backend-file,id=hvr,size=" + std::to_string(kRegionSize) +
          ",mem-path=" + region_path + ",share=on",
      "-device", "ivshmem-plain,memdev=hvr,id=ivs0"};
  for (std::string& arg : MetaPortArgs(sock)) qemu_args.push_back(std::move(arg));
  ASSERT_TRUE(guest.Boot(*image, qemu_args).ok()) << guest.Diagnostics();
  MetaHost host(sock);
  ASSERT_TRUE(host.Connect(30s)) << "cannot connect to " << sock << "\n" << guest.Diagnostics();
  // The first kBoot: from the initramfs agent when the initramfs loads
  // virtio_console (Debian's does), else from the unit's.
  ASSERT_TRUE(
      host.ReadUntil([&] { return host.Find(meta::MetaType::kBoot) != nullptr; }, kDiskBootTimeout))
      << guest.Diagnostics();
  std::printf("[debian-image] %6.1f s  first kBoot: %zu bytes raw, %llu on the wire\n", seconds(),
              host.Find(meta::MetaType::kBoot)->payload.size(),
              static_cast<unsigned long long>(host.boot_wire));

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
  // The unit's sandbox leaves /run/hvtrace writable: the agent publishes the
  // region there for direct-write programs (region_writer.h kRegionPointerFile).
  EXPECT_TRUE(step("region pointer published in /run/hvtrace/region",
                   std::regex("hvtrace-demo-marker: region pointer: /sys/bus/pci/devices/"
                              "[0-9a-f:.]+/resource2 [0-9a-f]+")));
  ASSERT_TRUE(
      step("multi-user.target reached", std::regex("Reached target .*multi-user\\.target")));

  CheckMetaChannel(guest, host, *image, seconds);

  // The unit's agent (after the initramfs one let go) runs in the region.
  auto running = [&] {
    const RegionSnapshot snap = (*region)->Read();
    return snap.guest.present && snap.guest.status.state == region::kStateRunning;
  };
  EXPECT_TRUE(WaitUntil(running, 60s)) << "no agent running in the region\n" << guest.Diagnostics();
  std::printf("[debian-image] %6.1f s  agent running in the region\n", seconds());
  // The unit's capabilities still let it read kallsyms with addresses
  // (CAP_SYSLOG): it publishes the symbols instead of reporting them restricted.
  uint32_t symbols_state = 0;
  EXPECT_TRUE(WaitUntil(
      [&] {
        symbols_state = (*region)->Read().guest.status.symbols_state;
        return symbols_state != 0;
      },
      60s))
      << "the agent never said what it did with the symbols\n"
      << guest.Diagnostics();
  EXPECT_EQ(symbols_state, static_cast<uint32_t>(region::kSymbolsPublished))
      << "symbols not published (region.h SymbolsState: 2 = kallsyms showed zero addresses)\n"
      << guest.Diagnostics();
  // The demo service wrote its line into instances/hvtrace at boot, before or
  // while the unit's agent took over from the initramfs one: the handover
  // keeps the instance's backlog, so the line reaches the region, and it
  // decodes with the formats this kernel's agent published.
  std::optional<std::string> marker;
  EXPECT_TRUE(WaitUntil(
      [&] {
        marker = DecodedMarker((*region)->Read(), "HVTRACE-DEMO-MARKER boot");
        return marker.has_value();
      },
      30s))
      << "the demo marker never reached the region as a decoded ftrace:print event (raw text "
      << (AnyRecordContains(AllRecords((*region)->Read()), "HVTRACE-DEMO-MARKER boot") ? "present"
                                                                                       : "absent")
      << ")\n"
      << guest.Diagnostics();
  std::string shown = marker.value_or("");
  if (!shown.empty() && shown.back() == '\n') shown.pop_back();
  std::printf(
      "[debian-image] %6.1f s  demo marker in the region, decoded: ftrace:print buf=\"%s\"\n",
      seconds(), shown.c_str());

  const std::string log = guest.ConsoleLog();
  EXPECT_TRUE(
      std::regex_search(log, std::regex("hvtrace-agent\\[[0-9]+\\]: hvtrace-agent: attached ")))
      << "the unit's agent did not attach the region\n"
      << guest.Diagnostics();
  // The agent of the unit speaks on the console (StandardError=journal+console).
  EXPECT_TRUE(std::regex_search(log, std::regex("hvtrace-agent\\[[0-9]+\\]: hvtrace-agent: ")))
      << "no line of the unit's agent on the console\n"
      << guest.Diagnostics();
  EXPECT_EQ(log.find("FAILED"), std::string::npos) << "a unit failed\n" << guest.Diagnostics();
  EXPECT_EQ(log.find("emergency"), std::string::npos) << guest.Diagnostics();
  EXPECT_EQ(log.find("still running 5 s after SIGTERM"), std::string::npos)
      << "the initramfs agent ignored SIGTERM\n"
      << guest.Diagnostics();

  for (const std::string& e : host.errors) ADD_FAILURE() << "meta decoder: " << e;
  const double before_poweroff = seconds();
  ASSERT_TRUE(guest.PowerOff(120s).ok()) << guest.Diagnostics();
  std::printf("[debian-image] %6.1f s  powered off (%.1f s after system_powerdown)\n", seconds(),
              seconds() - before_poweroff);
  unlink(sock.c_str());
}

// "debian13_7_3" in test names; PrintTo (disk_guest.h) for the messages.
INSTANTIATE_TEST_SUITE_P(Releases, DebianImageE2eTest, ::testing::Values(kDebian12, kDebian13),
                         [](const ::testing::TestParamInfo<DebianRelease>& param) {
                           std::string name = param.param.guest + "_" + param.param.kernel;
                           for (char& c : name) c = c == '.' ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace hvtrace::e2e
