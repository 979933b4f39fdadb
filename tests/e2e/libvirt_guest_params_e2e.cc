// A libvirt domain whose boot-range kernel parameters are not in its
// <os><cmdline> but come from inside the guest, as a disk-booted VM's come
// from its own boot loader (issue #12): `hvtrace adopt` finds the range from
// the NUMA cell of `hvtrace domain-xml --numa` and the guest's own
// persistent-buffer meta in the cell's file.
//
// The 6.12 test kernel has no CONFIG_BOOT_CONFIG, so bootconfig cannot carry
// the parameters. Instead the guest boots a first stage (<cmdline> only
// `console=ttyS0 mem=448M`) and that stage loads the real kernel itself with
// kexec_file_load and the parameters on its own command line — what a
// kexec boot loader (petitboot, LinuxBoot) does; the parameters are the ones
// the adopt reply tells the user to add. libvirt never sees them.
//
// Adopted once before the domain starts and once while it runs (the first
// stage), then the guest writes markers to its boot instance and panics:
// the capture holds the boot range's events, decoded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "hvtraced_harness.h"
#include "libvirtd_fixture.h"
#include "manifest_layout.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// The first stage's command line, the domain's <cmdline>. mem= keeps the
// first stage out of NUMA node 1 (448M = node 0 of this 512M domain): a
// kexec_file_load places the next kernel's segments top-down in the RAM it
// knows, and segments inside what the next kernel reserves with memmap=
// hang it before its console comes up (seen). A boot loader run from
// firmware is not in node 1 either. hvtrace reads no <cmdline> for the range.
constexpr const char* kFirstStageCmdline = "console=ttyS0 mem=448M";

// `hvtrace domain-xml` for the boot range, with the kernel parameters taken
// out of <cmdline> again: the definition a user has whose guest sets them
// in its own boot loader.
Result<std::string> DomainWithoutParams(const TestDomain& domain, const GuestImage& image,
                                        const std::string& initrd) {
  const std::vector<std::string> common = {
      BinPath("hvtrace"), "domain-xml", "--name",     domain.name(), "--kernel",
      image.kernel,       "--initrd",   initrd,       "--memory",    "512M",
      "--range",          "16M",        "--on-crash", "preserve"};
  std::vector<std::string> params_argv = common;
  params_argv.push_back("--params");
  Result<std::string> params = RunArgv(params_argv);
  if (!params.ok()) return params.error();
  std::vector<std::string> xml_argv = common;
  for (const std::string& a : {std::string("--console-socket"), domain.console_socket(),
                               std::string("--console-log"), domain.console_log()}) {
    xml_argv.push_back(a);
  }
  Result<std::string> xml = RunArgv(xml_argv);
  if (!xml.ok()) return xml.error();
  std::string p = *params;
  while (!p.empty() && (p.back() == '\n' || p.back() == ' ')) p.pop_back();
  const std::string with = "<cmdline>console=ttyS0 " + p + "</cmdline>";
  const size_t at = xml->find(with);
  if (at == std::string::npos) return Error{"no '" + with + "' in:\n" + *xml};
  xml->replace(at, with.size(), "<cmdline>" + std::string(kFirstStageCmdline) + "</cmdline>");
  return *xml;
}

Status WriteMarkers(TestDomain& domain, const std::string& prefix, int count) {
  Result<hostd::GuestConsole::CommandResult> r =
      domain.console().Run("for i in $(seq 1 " + std::to_string(count) + "); do echo " + prefix +
                               "-$i > /sys/kernel/tracing/instances/boot_map/trace_marker; done",
                           kCommandTimeout);
  if (!r.ok()) return r.error();
  if (r->status != 0) return Error{"writing markers failed: " + r->output};
  return {};
}

// The guest's own boot stage: kexec into the same kernel with |params| on
// the command line it gives the kernel (never libvirt's <cmdline>).
Status BootWithParamsFromInside(TestDomain& domain, const std::string& params) {
  Result<hostd::GuestConsole::CommandResult> before =
      domain.console().Run("cat /proc/cmdline", kCommandTimeout);
  if (!before.ok()) return before.error();
  if (before->output.find("memmap=") != std::string::npos) {
    return Error{"the first stage already has memmap=: " + before->output};
  }
  if (Status s =
          domain.console().Send("hvtrace-kexec-self --append 'console=ttyS0 " + params + "'\n");
      !s.ok()) {
    return s;
  }
  Result<std::string> ready = domain.console().WaitForLine("HVTRACE-GUEST-READY", kBootTimeout);
  if (!ready.ok()) return Error{ready.error().message + "\n" + domain.Diagnostics()};
  Result<hostd::GuestConsole::CommandResult> after =
      domain.console().Run("cat /proc/cmdline", kCommandTimeout);
  if (!after.ok()) return after.error();
  if (after->output.find(params) == std::string::npos) {
    return Error{"the second stage's command line lacks the parameters: " + after->output};
  }
  return {};
}

class LibvirtGuestParamsE2e : public ::testing::TestWithParam<bool> {};

TEST_P(LibvirtGuestParamsE2e, BootRangeFoundFromTheCellNotTheCmdline) {
  const bool adopt_before_start = GetParam();
  if (std::string why = LibvirtdUnavailableReason(); !why.empty()) {
    GTEST_SKIP() << "private libvirtd cannot run here: " << why;
  }
  Result<GuestImage> image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  Result<std::string> initrd = FindKexecInitrd(*image);
  ASSERT_TRUE(initrd.ok()) << initrd.error().message;
  // The kernel's event formats, as a user gets them before the first capture.
  Result<std::string> harvest = RunArgv({BinPath("hvtrace"), "formats", "harvest", "--kernel",
                                         image->kernel, "--initrd", image->initrd});
  ASSERT_TRUE(harvest.ok()) << harvest.error().message;

  const std::string tag = adopt_before_start ? "gpb" : "gpa";
  Result<std::unique_ptr<PrivateLibvirtd>> libvirtd = PrivateLibvirtd::Start(tag);
  ASSERT_TRUE(libvirtd.ok()) << libvirtd.error().message;
  PrivateLibvirtd& lv = **libvirtd;
  HvtracedProcess hvt({.tag = tag, .libvirt_uri = lv.uri()});
  ASSERT_TRUE(hvt.Start().ok()) << hvt.LogTail();
  ASSERT_TRUE(hvt.WaitForLibvirt([](const json& l) { return l["connected"] == true; }, 30s).ok())
      << hvt.LogTail();

  TestDomain domain(lv, tag);
  Result<std::string> xml = DomainWithoutParams(domain, *image, *initrd);
  ASSERT_TRUE(xml.ok()) << xml.error().message;
  ASSERT_THAT(*xml, Not(HasSubstr("memmap="))) << *xml;
  ASSERT_THAT(*xml, Not(HasSubstr("trace_instance="))) << *xml;
  ASSERT_THAT(*xml, HasSubstr("<cmdline>" + std::string(kFirstStageCmdline) + "</cmdline>"));
  TestDomainOptions options;
  options.raw_xml = *xml;
  options.via_virsh = true;
  options.start = !adopt_before_start;
  Status created = domain.Create(*image, options);
  ASSERT_TRUE(created.ok()) << created.error().message << "\n" << *xml;

  Result<json> adopted = hvt.HvtraceJson({"adopt", domain.name()});
  ASSERT_TRUE(adopted.ok()) << adopted.error().message << "\n" << hvt.LogTail();
  const json& boot = (*adopted)["boot_range"];
  EXPECT_EQ((*adopted)["region"]["kind"], "boot-range") << adopted->dump(2);
  EXPECT_EQ((*adopted)["region"]["size"], 16u << 20);
  EXPECT_EQ(boot["source"], "numa-cell") << adopted->dump(2);
  EXPECT_EQ(boot["gpa"], "0x1c000000");  // Node 0 of 512M less the 64M cell.
  EXPECT_EQ(boot["guest_meta"]["state"], adopt_before_start ? "not-running" : "absent")
      << adopted->dump(2);
  EXPECT_THAT(boot["note"].get<std::string>(),
              HasSubstr("guest has not written a persistent-buffer meta yet"));
  EXPECT_FALSE(boot.contains("cmdline_note")) << adopted->dump(2);
  const std::string params = boot["kernel_params"];
  EXPECT_THAT(params, HasSubstr("memmap=16M$0x1c000000"));
  EXPECT_THAT(params, HasSubstr("trace_instance=boot_map@0x1c000000:16M"));

  // Before start: the daemon opens this run's node-1 file when libvirt says
  // the domain started.
  if (adopt_before_start) {
    ASSERT_TRUE(domain.Start().ok()) << domain.Diagnostics();
  }
  auto deadline = std::chrono::steady_clock::now() + 30s;
  json status;
  while (std::chrono::steady_clock::now() < deadline) {
    Result<json> s = hvt.HvtraceJson({"status", domain.name()});
    if (s.ok()) status = *s;
    if (s.ok() && (*s)["backend"]["region"]["open"] == true) break;
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_EQ(status["backend"]["region"]["open"], true) << status.dump(2) << "\n" << hvt.LogTail();
  EXPECT_THAT(status["backend"]["region"]["path"].get<std::string>(),
              HasSubstr(lv.dir() + "/ram/"));

  Status second_stage = BootWithParamsFromInside(domain, params);
  ASSERT_TRUE(second_stage.ok()) << second_stage.error().message;
  ASSERT_TRUE(WriteMarkers(domain, "hvt-gp-" + tag, 8).ok()) << domain.Diagnostics();
  // Adopted again now, the reply finds the meta the guest's kernel wrote.
  RunResult stop = hvt.Hvtrace({"stop", domain.name()});
  ASSERT_EQ(stop.status, 0) << stop.output << "\n" << hvt.LogTail();
  Result<json> again = hvt.HvtraceJson({"adopt", domain.name()});
  ASSERT_TRUE(again.ok()) << again.error().message << "\n" << hvt.LogTail();
  const json& meta = (*again)["boot_range"]["guest_meta"];
  EXPECT_EQ(meta["state"], "present") << again->dump(2);
  EXPECT_EQ(meta["cpus"], 2) << again->dump(2);
  EXPECT_EQ(meta["metas_valid"], 2) << again->dump(2);
  EXPECT_FALSE((*again)["boot_range"].contains("note")) << again->dump(2);
  ASSERT_TRUE(domain.console().Send("echo c > /proc/sysrq-trigger\n").ok());
  Result<json> captures = hvt.WaitForCaptures(domain.name(), 1, 90s);
  ASSERT_TRUE(captures.ok()) << captures.error().message << "\n" << domain.Diagnostics();
  const std::string path = (*captures)["captures"][0]["path"];
  json manifest = json::parse(ReadWhole(path + "/manifest.json"), nullptr, false);
  ASSERT_TRUE(manifest.is_object()) << path;
  EXPECT_EQ(manifest["trigger"], "panic");
  ExpectBootRangeManifestLayout(manifest, "libvirt");
  EXPECT_EQ(manifest["region"]["gpa"], 0x1c000000u) << manifest["region"].dump();
  EXPECT_EQ(manifest["validation"]["reader"], "boot_map");
  EXPECT_EQ(manifest["extra"]["formats"]["decoded"], true) << manifest["extra"].dump(2);
  RunResult show = RunArgvStatus({BinPath("hvtrace"), "show", path});
  ASSERT_EQ(show.status, 0) << show.output.substr(0, 4000);
  EXPECT_THAT(show.output, HasSubstr("initcall_finish"));  // The second stage's early boot.
  EXPECT_THAT(show.output, HasSubstr("hvt-gp-" + tag + "-8"));
  std::printf("[ metric ] guest-params boot range (%s): %s events in the panic capture\n",
              adopt_before_start ? "adopted before start" : "adopted while running",
              manifest["totals"]["events"].dump().c_str());
}

INSTANTIATE_TEST_SUITE_P(AdoptTime, LibvirtGuestParamsE2e, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "BeforeStart" : "WhileRunning";
                         });

}  // namespace
}  // namespace hvtrace::e2e
