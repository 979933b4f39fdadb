// `hvtrace setup DOMAIN` and `hvtrace setup --undo DOMAIN` on a real (private)
// libvirtd (issue #12): a plain domain, defined as a user has it, gets the
// boot range's NUMA cells, the agent's channel and a panic device in its
// persistent definition; the daemon then finds the range from the cells when
// the domain boots, and undo gives back the definition libvirt had before.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "domain_xml.h"
#include "hvtrace/handshake_kprobes.h"
#include "hvtraced_harness.h"
#include "libvirt_client.h"
#include "libvirtd_fixture.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

Result<std::string> PersistentXml(const PrivateLibvirtd& lv, const std::string& name) {
  return RunArgv({"virsh", "-q", "-c", lv.uri(), "dumpxml", "--inactive", name});
}

// Inside the guest: the agent finds node 1 in its own ACPI SRAT and computes
// |host_params|, the parameters the host printed; with a syslinux config
// (made here in the initramfs) it puts them on the APPEND line, and takes
// them off again.
void CheckAgentInGuest(TestDomain& domain, const std::string& host_params) {
  // The guest's printf makes the newlines: a console command is one line.
  const std::string config = "DEFAULT l\\nLABEL l\\n  APPEND console=ttyS0\\n";
  Result<hostd::GuestConsole::CommandResult> made = domain.console().Run(
      "mkdir -p /boot/syslinux && printf '" + config + "' > /boot/syslinux/syslinux.cfg",
      kCommandTimeout);
  ASSERT_TRUE(made.ok() && made->status == 0) << domain.Diagnostics();
  Result<hostd::GuestConsole::CommandResult> dry =
      domain.console().Run("hvtrace-agent boot-buffer enable --dry-run", kCommandTimeout);
  ASSERT_TRUE(dry.ok()) << dry.error().message;
  std::printf("in the guest, boot-buffer enable --dry-run printed:\n%s\n", dry->output.c_str());
  EXPECT_EQ(dry->status, 0) << dry->output;
  EXPECT_THAT(dry->output, HasSubstr("node 1: 67108864 bytes at 0x20000000 (ACPI SRAT)"));
  // The boot timeline's handshake kprobes come after the range's parameters,
  // then the clock that keeps their records (guest-agent/src/boot_buffer.h).
  EXPECT_THAT(dry->output, HasSubstr("kernel parameters: " + host_params + " " +
                                     std::string(kHandshakeKprobeParam) + " trace_clock=local\n"));
  Result<hostd::GuestConsole::CommandResult> enabled = domain.console().Run(
      "hvtrace-agent boot-buffer enable >/dev/null && cat /boot/syslinux/syslinux.cfg",
      kCommandTimeout);
  ASSERT_TRUE(enabled.ok()) << enabled.error().message;
  EXPECT_THAT(enabled->output, HasSubstr("  APPEND console=ttyS0 " + host_params));
  Result<hostd::GuestConsole::CommandResult> disabled = domain.console().Run(
      "hvtrace-agent boot-buffer disable >/dev/null && cat /boot/syslinux/syslinux.cfg",
      kCommandTimeout);
  ASSERT_TRUE(disabled.ok()) << disabled.error().message;
  EXPECT_THAT(disabled->output, HasSubstr("  APPEND console=ttyS0"));
  EXPECT_THAT(disabled->output, Not(HasSubstr("memmap=")));
}

TEST(LibvirtSetupE2e, SetupThenBootThenUndo) {
  if (std::string why = LibvirtdUnavailableReason(); !why.empty()) {
    GTEST_SKIP() << "private libvirtd cannot run here: " << why;
  }
  Result<GuestImage> image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  Result<std::unique_ptr<PrivateLibvirtd>> libvirtd = PrivateLibvirtd::Start("setup");
  ASSERT_TRUE(libvirtd.ok()) << libvirtd.error().message;
  PrivateLibvirtd& lv = **libvirtd;
  HvtracedProcess hvt({.tag = "setup", .libvirt_uri = lv.uri()});
  ASSERT_TRUE(hvt.Start().ok()) << hvt.LogTail();
  ASSERT_TRUE(hvt.WaitForLibvirt([](const json& l) { return l["connected"] == true; }, 30s).ok())
      << hvt.LogTail();

  // A plain domain: 512M, no NUMA, no channel, no panic device, libvirt's
  // default <on_crash>.
  TestDomain domain(lv, "setup");
  TestDomainOptions options;
  options.start = false;
  options.via_virsh = true;
  std::string xml = domain.MakeXml(*image, options);
  for (const std::string cut :
       {"    <panic model='isa'/>\n", "  <on_crash>preserve</on_crash>\n"}) {
    ASSERT_NE(xml.find(cut), std::string::npos) << xml;
    xml.erase(xml.find(cut), cut.size());
  }
  options.raw_xml = xml;
  ASSERT_TRUE(domain.Create(*image, options).ok()) << domain.Diagnostics();
  Result<std::string> original = PersistentXml(lv, domain.name());
  ASSERT_TRUE(original.ok()) << original.error().message;
  ASSERT_THAT(*original, Not(HasSubstr("<numa>")));
  ASSERT_THAT(*original, Not(HasSubstr("<panic")));

  Result<json> dry_json = hvt.HvtraceJson({"setup", "--dry-run", domain.name()});
  ASSERT_TRUE(dry_json.ok()) << dry_json.error().message;
  EXPECT_THAT((*dry_json)["diff"].get<std::string>(), HasSubstr("+    <numa>"));
  EXPECT_EQ((*dry_json)["defined"], false);
  RunResult dry = hvt.Hvtrace({"setup", "--dry-run", domain.name()});
  ASSERT_EQ(dry.status, 0) << dry.output << "\n" << hvt.LogTail();
  EXPECT_THAT(dry.output, HasSubstr("dry run: domain " + domain.name() + " not changed"));
  EXPECT_THAT(dry.output, HasSubstr("+      <cell id='1' memory='65536' unit='KiB' "
                                    "memAccess='shared'/>"));
  EXPECT_EQ(*PersistentXml(lv, domain.name()), *original);

  RunResult setup = hvt.Hvtrace({"setup", domain.name()});
  ASSERT_EQ(setup.status, 0) << setup.output << "\n" << hvt.LogTail();
  std::printf("hvtrace setup printed:\n%s\n", setup.output.c_str());
  EXPECT_THAT(setup.output, HasSubstr("--- " + domain.name() + ".xml (before)"));
  EXPECT_THAT(setup.output,
              HasSubstr("+      <cell id='0' cpus='0-1' memory='524288' unit='KiB'/>"));
  EXPECT_THAT(setup.output, HasSubstr("+      <cell id='1' memory='65536' unit='KiB' "
                                      "memAccess='shared'/>"));
  EXPECT_THAT(setup.output, HasSubstr("+      <target type='virtio' name='org.hvtrace.agent.0'"));
  EXPECT_THAT(setup.output, HasSubstr("+    <panic model='isa'"));
  EXPECT_THAT(setup.output, HasSubstr("+  <on_crash>preserve</on_crash>"));
  EXPECT_THAT(setup.output, HasSubstr("kernel parameters the guest must add: memmap=16M$0x20000000 "
                                      "trace_instance=boot_map@0x20000000:16M,"));
  EXPECT_THAT(setup.output, HasSubstr("inside the guest: hvtrace-agent boot-buffer enable"));

  // libvirt kept it all, and the range is where the daemon will look.
  Result<std::string> after = PersistentXml(lv, domain.name());
  ASSERT_TRUE(after.ok());
  EXPECT_THAT(*after, HasSubstr("<target type='virtio' name='org.hvtrace.agent.0'/>"));
  EXPECT_THAT(*after, HasSubstr("<hvtrace:setup xmlns:hvtrace=\"https://hvtrace.dev/setup/1\">"));
  Result<hostd::DomainXmlInfo> info = hostd::ParseDomainXml(*after);
  ASSERT_TRUE(info.ok()) << info.error().message;
  // QEMU's boot-handshake trace events, kept by libvirt (the boot timeline).
  EXPECT_THAT(*after, HasSubstr("<qemu:arg value='enable=virtio_set_status'/>")) << *after;
  EXPECT_FALSE(info->qemu_trace_events.empty()) << *after;
  EXPECT_EQ(info->panic_models, std::vector<std::string>{"isa"});
  Result<hostd::DomainBootCell> cell = hostd::FindDomainBootCell(*info, "boot_map", "");
  ASSERT_TRUE(cell.ok()) << cell.error().message << "\n" << *after;
  EXPECT_EQ(cell->layout.range_gpa, 512u << 20);
  EXPECT_EQ(cell->layout.range_bytes, 16u << 20);

  // --json carries the same diff (computed by the CLI), empty now.
  Result<json> again_json = hvt.HvtraceJson({"setup", domain.name()});
  ASSERT_TRUE(again_json.ok()) << again_json.error().message;
  EXPECT_EQ((*again_json)["already_set_up"], true);
  EXPECT_EQ((*again_json)["diff"], "");
  RunResult again = hvt.Hvtrace({"setup", domain.name()});
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr("already set up"));
  EXPECT_EQ(*PersistentXml(lv, domain.name()), *after);

  // The new definition boots, with the agent's channel, and the daemon finds
  // the range from the cells.
  ASSERT_TRUE(domain.Start().ok()) << domain.Diagnostics();
  Result<std::string> live = RunArgv({"virsh", "-q", "-c", lv.uri(), "dumpxml", domain.name()});
  ASSERT_TRUE(live.ok());
  EXPECT_THAT(*live, HasSubstr("name='org.hvtrace.agent.0' state="));
  // Inside the guest: the agent computes what the host printed.
  const std::string kHostParams = "kernel parameters the guest must add: ";
  const size_t at = setup.output.find(kHostParams) + kHostParams.size();
  CheckAgentInGuest(domain, setup.output.substr(at, setup.output.find('\n', at) - at));

  Result<json> adopted = hvt.HvtraceJson({"adopt", domain.name()});
  ASSERT_TRUE(adopted.ok()) << adopted.error().message << "\n" << hvt.LogTail();
  EXPECT_EQ((*adopted)["region"]["kind"], "boot-range") << adopted->dump(2);
  EXPECT_EQ((*adopted)["boot_range"]["source"], "numa-cell") << adopted->dump(2);
  EXPECT_EQ((*adopted)["boot_range"]["gpa"], "0x20000000") << adopted->dump(2);
  ASSERT_EQ(hvt.Hvtrace({"stop", domain.name()}).status, 0);

  // Undo while it runs: the persistent definition is libvirt's original again.
  RunResult undo = hvt.Hvtrace({"setup", "--undo", domain.name()});
  ASSERT_EQ(undo.status, 0) << undo.output << "\n" << hvt.LogTail();
  EXPECT_THAT(undo.output, HasSubstr("-      <cell id='1'"));
  EXPECT_THAT(undo.output, HasSubstr("it is running with the old one"));
  EXPECT_EQ(*PersistentXml(lv, domain.name()), *original);
  RunResult undo_again = hvt.Hvtrace({"setup", "--undo", domain.name()});
  EXPECT_NE(undo_again.status, 0);
  EXPECT_THAT(undo_again.output, HasSubstr("not set up by `hvtrace setup`"));
}

}  // namespace
}  // namespace hvtrace::e2e

namespace hvtrace::e2e {
namespace {

// q35: libvirt puts the new virtio-serial controller on a root port, so
// setup adds a free one for `hvtrace attach` and records both for undo. A
// domain whose NUMA cells are not hvtrace's is refused and left as it was.
// A transient domain is refused too. None of them boots.
TEST(LibvirtSetupE2e, Q35ForeignNumaAndTransient) {
  if (std::string why = LibvirtdUnavailableReason(); !why.empty()) {
    GTEST_SKIP() << "private libvirtd cannot run here: " << why;
  }
  Result<GuestImage> image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  Result<std::unique_ptr<PrivateLibvirtd>> libvirtd = PrivateLibvirtd::Start("setupq");
  ASSERT_TRUE(libvirtd.ok()) << libvirtd.error().message;
  PrivateLibvirtd& lv = **libvirtd;
  HvtracedProcess hvt({.tag = "setupq", .libvirt_uri = lv.uri()});
  ASSERT_TRUE(hvt.Start().ok()) << hvt.LogTail();
  ASSERT_TRUE(hvt.WaitForLibvirt([](const json& l) { return l["connected"] == true; }, 30s).ok())
      << hvt.LogTail();

  TestDomain q35(lv, "setupq");
  TestDomainOptions options;
  options.start = false;
  options.via_virsh = true;
  options.machine = "q35";
  // A password libvirt leaves out of the XML it shows: redefining from that
  // XML would drop it, and the reply must not carry it to the user.
  options.extra_devices = "    <graphics type='vnc' port='-1' passwd='hvtsec81'/>\n";
  ASSERT_TRUE(q35.Create(*image, options).ok()) << q35.Diagnostics();
  Result<std::string> original = PersistentXml(lv, q35.name());
  ASSERT_TRUE(original.ok()) << original.error().message;
  auto secure = [&] {
    return RunArgv(
        {"virsh", "-q", "-c", lv.uri(), "dumpxml", "--inactive", "--security-info", q35.name()});
  };
  ASSERT_THAT(*secure(), HasSubstr("passwd='hvtsec81'"));
  RunResult setup = hvt.Hvtrace({"setup", "--json", q35.name()});
  ASSERT_EQ(setup.status, 0) << setup.output << "\n" << hvt.LogTail();
  EXPECT_THAT(setup.output, Not(HasSubstr("hvtsec81")));
  EXPECT_THAT(*secure(), HasSubstr("passwd='hvtsec81'"));
  EXPECT_THAT(setup.output, HasSubstr("libvirt added <controller type='virtio-serial'"));
  Result<std::string> after = PersistentXml(lv, q35.name());
  ASSERT_TRUE(after.ok());
  Result<hostd::DomainXmlInfo> info = hostd::ParseDomainXml(*after);
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_TRUE(info->q35);
  EXPECT_TRUE(info->hotplug_ok) << info->hotplug_reason << "\n" << *after;
  Result<hostd::DomainBootCell> cell = hostd::FindDomainBootCell(*info, "boot_map", "");
  ASSERT_TRUE(cell.ok()) << cell.error().message;
  EXPECT_EQ(cell->layout.range_gpa, 512u << 20);
  RunResult undo = hvt.Hvtrace({"setup", "--undo", q35.name()});
  ASSERT_EQ(undo.status, 0) << undo.output;
  EXPECT_EQ(*PersistentXml(lv, q35.name()), *original);
  EXPECT_THAT(*secure(), HasSubstr("passwd='hvtsec81'"));

  TestDomain foreign(lv, "setupf");
  TestDomainOptions foreign_options;
  foreign_options.start = false;
  foreign_options.via_virsh = true;
  std::string xml = foreign.MakeXml(*image, foreign_options);
  xml.insert(xml.find("  <on_poweroff>"),
             "  <cpu><numa><cell id='0' cpus='0' memory='262144' unit='KiB'/>"
             "<cell id='1' cpus='1' memory='262144' unit='KiB'/></numa></cpu>\n");
  foreign_options.raw_xml = xml;
  ASSERT_TRUE(foreign.Create(*image, foreign_options).ok()) << foreign.Diagnostics();
  Result<std::string> before = PersistentXml(lv, foreign.name());
  ASSERT_TRUE(before.ok());
  RunResult refused = hvt.Hvtrace({"setup", foreign.name()});
  EXPECT_NE(refused.status, 0) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("domain '" + foreign.name() +
                                        "': it already has a NUMA topology that is not hvtrace's"));
  EXPECT_EQ(*PersistentXml(lv, foreign.name()), *before);

  // A transient domain (virsh create, paused: no guest code runs) has no
  // persistent definition to edit, and defining one would make it
  // persistent behind its owner's back: refused.
  TestDomain transient(lv, "setupt");
  const std::string file = lv.dir() + "/" + transient.name() + ".xml";
  std::ofstream(file) << transient.MakeXml(*image, TestDomainOptions{});
  Result<std::string> created =
      RunArgv({"virsh", "-q", "-c", lv.uri(), "create", "--paused", file});
  ASSERT_TRUE(created.ok()) << created.error().message;
  RunResult refused_transient = hvt.Hvtrace({"setup", transient.name()});
  EXPECT_NE(refused_transient.status, 0) << refused_transient.output;
  EXPECT_THAT(refused_transient.output,
              HasSubstr("domain '" + transient.name() + "' is transient"));
  (void)RunArgv({"virsh", "-q", "-c", lv.uri(), "destroy", transient.name()});
}

}  // namespace
}  // namespace hvtrace::e2e
