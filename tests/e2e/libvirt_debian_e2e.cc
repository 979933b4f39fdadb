// The issue #12 workflow on the VM users have: the Debian 12 disk image
// (qemu-scripts/build-debian-image.sh: syslinux, Debian's 6.12 kernel and
// initramfs-tools initrd, systemd, hvtrace-agent.service) as a libvirt
// domain of a private libvirtd, booted from its own disk. The host never has
// its kernel file and no harvest runs: names and symbols come from the
// agent's metadata channel (virtio-serial, hvtrace/meta_channel.h).
//
//   1. `hvtrace setup` adds the boot-range NUMA cell, the channel and pvpanic
//      to the persistent definition; the guest boots, its agent unit sends
//      the boot's metadata; `hvtrace attach` + `hvtrace stream` show kernel
//      events with task names and symbols and the demo service's
//      trace_marker line, while trace-cmd in the guest records its own trace.
//   2. The boot range is enabled from inside the guest
//      (`hvtrace-agent boot-buffer enable`, its boot loader), the guest
//      reboots, kexecs itself (`systemctl kexec`) and panics: the capture
//      decodes both boots, each with its own boot's symbols, the first with
//      the initramfs stage's early events.
//
// The test types into the image's root shell on ttyS0 (a fixture of the
// test image, as an administrator at the console).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "hvtraced_harness.h"
#include "libvirtd_fixture.h"
#include "stream_reader.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// A systemd boot under TCG with other guests on two cores: ~50 s alone.
constexpr std::chrono::milliseconds kDiskBootTimeout = 300s;
constexpr std::chrono::milliseconds kGuestCommandTimeout = 120s;

struct Fixture {
  std::unique_ptr<PrivateLibvirtd> libvirtd;
  std::unique_ptr<HvtracedProcess> hvt;
  std::unique_ptr<TestDomain> domain;
  DiskImage image;
};

// Private libvirtd + hvtraced watching it + the image defined (not started).
// Returns a skip reason when the environment cannot run it.
std::string MakeFixture(const std::string& tag, Fixture* f) {
  if (std::string why = LibvirtdUnavailableReason(); !why.empty()) {
    return "private libvirtd cannot run here: " + why;
  }
  std::string skip;
  Result<DiskImage> image = FindDebianImage(&skip);
  if (!skip.empty()) return skip;
  EXPECT_TRUE(image.ok()) << image.error().message;
  if (!image.ok()) return "";
  f->image = *image;
  Result<std::unique_ptr<PrivateLibvirtd>> libvirtd = PrivateLibvirtd::Start(tag);
  EXPECT_TRUE(libvirtd.ok()) << libvirtd.error().message;
  if (!libvirtd.ok()) return "";
  f->libvirtd = std::move(*libvirtd);
  f->hvt = std::make_unique<HvtracedProcess>(
      HvtracedOptions{.tag = tag, .libvirt_uri = f->libvirtd->uri()});
  EXPECT_TRUE(f->hvt->Start().ok()) << f->hvt->LogTail();
  EXPECT_TRUE(
      f->hvt->WaitForLibvirt([](const json& l) { return l["connected"] == true; }, 30s).ok())
      << f->hvt->LogTail();
  f->domain = std::make_unique<TestDomain>(*f->libvirtd, tag);
  TestDomainOptions options;
  options.via_virsh = true;
  options.start = false;
  options.ready_timeout = kDiskBootTimeout;
  Result<std::string> xml = f->domain->MakeDiskXml(f->image, options);
  EXPECT_TRUE(xml.ok()) << xml.error().message;
  if (!xml.ok()) return "";
  options.raw_xml = *xml;
  Status created = f->domain->Create(GuestImage{}, options);
  EXPECT_TRUE(created.ok()) << created.error().message;
  return "";
}

std::string Diag(const Fixture& f) {
  return f.domain->Diagnostics() + "\n--- hvtraced ---\n" + f.hvt->LogTail();
}

// `hvtrace setup NAME`, as a user runs it on their domain.
Result<json> SetUpDomain(const Fixture& f) {
  return f.hvt->HvtraceJson({"setup", f.domain->name()});
}

Result<hostd::GuestConsole::CommandResult> Guest(Fixture& f, const std::string& command) {
  return f.domain->console().Run(command, kGuestCommandTimeout);
}

// Waits until hvtraced holds the channel metadata of |count| boots of the VM.
Result<json> WaitForMetaBoots(const Fixture& f, size_t count, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  json last;
  while (std::chrono::steady_clock::now() < deadline) {
    Result<json> s = f.hvt->HvtraceJson({"status", f.domain->name()});
    if (s.ok()) {
      last = *s;
      const json& meta = last["meta"];
      if (meta.is_object() && meta.value("boots_accepted", 0u) >= count) return last;
    }
    std::this_thread::sleep_for(500ms);
  }
  return Error{"no channel metadata of " + std::to_string(count) +
               " boots; status: " + last.dump(2)};
}

TEST(LibvirtDebianE2e, SetUpDomainStreamsKernelEventsWithNamesBesideTraceCmd) {
  Fixture f;
  if (std::string skip = MakeFixture("dst", &f); !skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(HasFailure());

  Result<json> setup = SetUpDomain(f);
  ASSERT_TRUE(setup.ok()) << setup.error().message << Diag(f);
  const std::string diff = (*setup)["diff"];
  EXPECT_THAT(diff, HasSubstr("<numa>")) << diff;
  EXPECT_THAT(diff, HasSubstr("org.hvtrace.agent.0")) << diff;
  EXPECT_THAT(diff, HasSubstr("<panic")) << diff;
  std::printf("[debian-libvirt] setup diff:\n%s\n", diff.c_str());

  Result<json> adopted = f.hvt->HvtraceJson({"adopt", f.domain->name()});
  ASSERT_TRUE(adopted.ok()) << adopted.error().message << Diag(f);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(f.domain->Start().ok()) << Diag(f);
  std::printf("[ metric ] Debian domain under libvirt (TCG): root shell after %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  Result<json> meta = WaitForMetaBoots(f, 1, 120s);
  ASSERT_TRUE(meta.ok()) << meta.error().message << Diag(f);

  Result<json> attached = f.hvt->HvtraceJson(
      {"attach", f.domain->name(), "--wait-ms", "120000", "--events",
       "sched:sched_switch,sched:sched_process_exec,timer:hrtimer_expire_entry"});
  ASSERT_TRUE(attached.ok()) << attached.error().message << Diag(f);
  StreamReader stream(*f.hvt, f.domain->name(), {.from_start = true});
  // trace-cmd records the top-level buffer at the same time; the agent's
  // instance is untouched by it and the other way round.
  auto tc = Guest(f,
                  "trace-cmd record -q -e sched:sched_switch -o /root/tc.dat sleep 3 >/dev/null "
                  "2>&1; trace-cmd report -i /root/tc.dat 2>/dev/null | grep -c sched_switch");
  ASSERT_TRUE(tc.ok()) << tc.error().message << Diag(f);
  EXPECT_EQ(tc->status, 0) << tc->output;
  // The count is the last line of digits: the units' console lines may
  // interleave with the command's output.
  int tc_events = 0;
  std::smatch count;
  for (std::string rest = tc->output;
       std::regex_search(rest, count, std::regex("(^|\n)([0-9]+)\r?(\n|$)"));
       rest = count.suffix()) {
    tc_events = std::stoi(count[2]);
  }
  EXPECT_GT(tc_events, 0) << "trace-cmd recorded nothing: " << tc->output;
  // A systemd service writes a marker after attach, through its unit.
  auto demo = Guest(f, "systemctl restart hvtrace-demo-marker.service");
  ASSERT_TRUE(demo.ok() && demo->status == 0) << (demo.ok() ? demo->output : "") << Diag(f);
  ASSERT_TRUE(stream.WaitForText("HVTRACE-DEMO-MARKER boot", 60s)) << stream.output() << Diag(f);
  // Kernel events: a symbol where the kernel prints %ps, task names where
  // the pid's comm is known (from the channel's / region's comms).
  ASSERT_TRUE(stream.WaitFor(
      [](const std::string& text) {
        return std::regex_search(text, std::regex("hrtimer_expire_entry:.*function=[a-z_]+"));
      },
      60s))
      << stream.output() << Diag(f);
  EXPECT_TRUE(std::regex_search(stream.text(), std::regex("\\btrace-cmd-[0-9]+ ")))
      << "no event of trace-cmd named by its task name\n"
      << stream.text().substr(0, 6000);
  std::printf(
      "[ metric ] Debian under libvirt: trace-cmd recorded %d sched_switch beside hvtrace\n",
      tc_events);
}

// Markers into the boot instance, from the guest's shell.
Status BootMarkers(Fixture& f, const std::string& prefix, int count) {
  auto r = Guest(f, "for i in $(seq 1 " + std::to_string(count) + "); do echo " + prefix +
                        "-$i > /sys/kernel/tracing/instances/boot_map/trace_marker; done");
  if (!r.ok()) return r.error();
  if (r->status != 0) return Error{"markers: " + r->output};
  return {};
}

// Sends |command| (which reboots or kexecs the guest) and waits for the
// root shell of the next boot.
Status NextBoot(Fixture& f, const std::string& command) {
  if (Status s = f.domain->console().Send(command + "\n"); !s.ok()) return s;
  Result<std::string> ready =
      f.domain->console().WaitForLine("HVTRACE-GUEST-READY", kDiskBootTimeout);
  if (!ready.ok()) return Error{ready.error().message};
  auto alive = Guest(f, "true");
  return alive.ok() ? Status{} : Status{alive.error()};
}

TEST(LibvirtDebianE2e, BootRangeFromTheGuestsLoaderKexecThenPanicDecodesEachBoot) {
  Fixture f;
  if (std::string skip = MakeFixture("dbr", &f); !skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(HasFailure());
  Result<json> setup = SetUpDomain(f);
  ASSERT_TRUE(setup.ok()) << setup.error().message << Diag(f);
  // Adopted before it starts: the range comes from the NUMA cell setup added.
  Result<json> adopted = f.hvt->HvtraceJson({"adopt", f.domain->name()});
  ASSERT_TRUE(adopted.ok()) << adopted.error().message << Diag(f);
  EXPECT_EQ((*adopted)["boot_range"]["source"], "numa-cell") << adopted->dump(2);
  const std::string params = (*adopted)["boot_range"]["kernel_params"];
  ASSERT_TRUE(f.domain->Start().ok()) << Diag(f);

  // Inside the guest: its own boot loader gets the parameters.
  auto enable = Guest(f, "hvtrace-agent boot-buffer enable");
  ASSERT_TRUE(enable.ok()) << enable.error().message << Diag(f);
  ASSERT_EQ(enable->status, 0) << enable->output;
  std::printf("[debian-libvirt] boot-buffer enable:\n%s\n", enable->output.c_str());
  auto cfg = Guest(f, "cat /boot/syslinux/syslinux.cfg");
  ASSERT_TRUE(cfg.ok());
  EXPECT_THAT(cfg->output, HasSubstr(params)) << cfg->output;

  ASSERT_TRUE(NextBoot(f, "reboot").ok()) << Diag(f);
  auto cmdline = Guest(f, "cat /proc/cmdline; ls -d /sys/kernel/tracing/instances/boot_map");
  ASSERT_TRUE(cmdline.ok() && cmdline->status == 0)
      << (cmdline.ok() ? cmdline->output : "") << Diag(f);
  EXPECT_THAT(cmdline->output, HasSubstr(params));
  ASSERT_TRUE(BootMarkers(f, "deb-boot-a", 5).ok()) << Diag(f);
  std::vector<std::string> boot_ids;
  auto boot_id = [&] {
    auto id = Guest(f, "cat /proc/sys/kernel/random/boot_id");
    std::smatch m;
    if (id.ok() && std::regex_search(id->output, m, std::regex("[0-9a-f-]{36}"))) {
      boot_ids.push_back(m[0]);
    }
  };
  boot_id();
  Result<json> before = WaitForMetaBoots(f, 2, 120s);
  ASSERT_TRUE(before.ok()) << before.error().message << Diag(f);

  // kexec into the same kernel with the same command line: the new boot
  // appends to the range. -s (kexec_file_load): the kernel places the
  // segments in RAM it knows; kexec_load (kexec-tools' default) places them
  // from the firmware's memory map, which still lists the range as RAM, and
  // overwrote the range's meta here ("Ring buffer boot meta[0] mismatch").
  ASSERT_TRUE(
      NextBoot(f,
               "kexec -s -l /boot/vmlinuz-$(uname -r) --initrd=/boot/initrd.img-$(uname -r) "
               "--reuse-cmdline && systemctl kexec")
          .ok())
      << Diag(f);
  // The guest's own view of the range after the kexec (the kernel says
  // whether it kept the previous boot's pages).
  auto view = Guest(f,
                    "dmesg | grep -i 'ring buffer\\|boot_map'; grep -c "
                    "deb-boot-a /sys/kernel/tracing/instances/boot_map/trace");
  if (view.ok())
    std::printf("[debian-libvirt] after kexec, in the guest:\n%s\n", view->output.c_str());
  ASSERT_TRUE(BootMarkers(f, "deb-boot-b", 5).ok()) << Diag(f);
  boot_id();
  ASSERT_EQ(boot_ids.size(), 2u);
  Result<json> after = WaitForMetaBoots(f, 3, 120s);
  ASSERT_TRUE(after.ok()) << after.error().message << Diag(f);

  ASSERT_TRUE(f.domain->console().Send("echo c > /proc/sysrq-trigger\n").ok());
  Result<json> panic = f.hvt->WaitForCapture(f.domain->name(), "panic", 120s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << Diag(f);
  const std::string path = (*panic)["path"];
  json manifest = json::parse(ReadWhole(path + "/manifest.json"), nullptr, false);
  ASSERT_TRUE(manifest.is_object()) << path;
  EXPECT_EQ(manifest["validation"]["boots"], 2) << manifest["validation"].dump(2);
  EXPECT_EQ(manifest["extra"]["formats"]["decoded"], true) << manifest["extra"].dump(2);
  // No kernel file, no harvest: the daemon's formats cache stays empty.
  std::printf("[debian-libvirt] formats: %s\n", manifest["extra"]["formats"].dump(2).c_str());

  const json& boots = manifest["extra"]["boots"];
  ASSERT_EQ(boots.size(), 2u) << manifest["extra"].dump(2);
  for (int boot : {0, 1}) {
    // Each boot with its own boot's metadata from the channel.
    const json& with = boots[boot]["decoded_with"];
    EXPECT_EQ(with["from"], "meta channel") << with.dump(2);
    EXPECT_EQ(with["boot_id"], boot_ids[boot]) << with.dump(2);
    std::printf("[debian-libvirt] boot %d: %s events, decoded with %s\n", boot,
                boots[boot]["events"].dump().c_str(), with.dump().c_str());
    const std::string file = path + "/boot-" + std::to_string(boot) + ".trace.dat";
    RunResult report = RunArgvStatus({"trace-cmd", "report", "-i", file});
    ASSERT_EQ(report.status, 0) << file << "\n" << report.output.substr(0, 3000);
    const std::string prefix = boot == 0 ? "deb-boot-a-5" : "deb-boot-b-5";
    EXPECT_THAT(report.output, HasSubstr(prefix)) << file;
    EXPECT_TRUE(
        std::regex_search(report.output, std::regex("hrtimer_expire_entry:.*function=[a-z_]+")))
        << "boot " << boot << " has no symbol for a timer function\n"
        << report.output.substr(0, 4000);
    EXPECT_THAT(report.output, HasSubstr("initcall_finish")) << "boot " << boot;
    // The initramfs stage: its agent and init scripts ran before systemd.
    EXPECT_TRUE(std::regex_search(report.output, std::regex("hvtrace-agent-[0-9]+ ")))
        << "boot " << boot << " names no task of the initramfs agent";
  }
}

}  // namespace
}  // namespace hvtrace::e2e
