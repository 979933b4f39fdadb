// hvtraced serving libvirt domains by name, driven as a user drives it: a
// real libvirtd that each test starts for itself (libvirtd_fixture.h), TCG
// domains with the 6.12 guest defined and started with `virsh`, a private
// hvtraced configured with that libvirtd's URI, and the `hvtrace` CLI.
// Covered: a boot-range domain from `hvtrace domain-xml` (early-boot events
// in the capture, `hvtrace show`), <on_crash> destroy and preserve, libvirtd
// down at daemon start and restarted while a domain runs, hvtraced restarted
// (re-adopts), a hot-plugged shmem region, an attach capture recovered after
// hvtraced died in the middle of it, and the errors people meet.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "formats_cache.h"
#include "hvtraced_harness.h"
#include "libvirt_attach.h"
#include "libvirtd_fixture.h"
#include "manifest_layout.h"
#include "stream_reader.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

#define LV_SKIP_UNLESS_AVAILABLE()                                     \
  do {                                                                 \
    if (std::string why = LibvirtdUnavailableReason(); !why.empty()) { \
      GTEST_SKIP() << "private libvirtd cannot run here: " << why;     \
    }                                                                  \
  } while (0)

#define LV_ASSERT_OK(expr)                      \
  do {                                          \
    auto&& _s = (expr);                         \
    ASSERT_TRUE(_s.ok()) << _s.error().message; \
  } while (0)

const std::string kBootMarker = "/sys/kernel/tracing/instances/boot_map/trace_marker";

// Removes /dev/shm files the test created, whatever happens.
struct ShmCleanup {
  std::vector<std::string> paths;
  ~ShmCleanup() {
    for (const auto& p : paths) unlink(p.c_str());
  }
};

std::string ShmName(const std::string& tag) {
  return "hvt-lv-" + tag + "-" + std::to_string(getpid());
}

// The guest kernel's event formats, as a user gets them before the first
// capture (a cache hit after the first harvest on this machine). Into the
// local cache by name (--cache), which these tests' daemons read: with a
// daemon answering on the default socket, the CLI would ask it instead.
Status HarvestFormats(const GuestImage& image) {
  Result<std::filesystem::path> cache = hostd::DefaultCacheRoot();
  if (!cache.ok()) return cache.error();
  Result<std::string> out =
      RunArgv({BinPath("hvtrace"), "formats", "harvest", "--kernel", image.kernel, "--initrd",
               image.initrd, "--cache", cache->string()});
  if (!out.ok()) return out.error();
  return {};
}

// `hvtrace domain-xml` for |domain| with the boot range.
Result<std::string> BootRangeXml(const TestDomain& domain, const GuestImage& image,
                                 const std::string& on_crash) {
  return RunArgv({BinPath("hvtrace"), "domain-xml", "--name", domain.name(), "--kernel",
                  image.kernel, "--initrd", image.initrd, "--memory", "512M", "--range", "16M",
                  "--on-crash", on_crash, "--console-socket", domain.console_socket(),
                  "--console-log", domain.console_log()});
}

// Counts ivshmem-plain (1af4:1110) devices the guest's PCI core sees.
Result<int> GuestIvshmemCount(TestDomain& domain) {
  Result<hostd::GuestConsole::CommandResult> r = domain.console().Run(
      "n=0; for d in /sys/bus/pci/devices/*; do [ \"$(cat $d/vendor):$(cat $d/device)\" = "
      "0x1af4:0x1110 ] && n=$((n+1)); done; echo IVSHMEM=$n",
      kCommandTimeout);
  if (!r.ok()) return r.error();
  size_t at = r->output.find("IVSHMEM=");
  if (at == std::string::npos) return Error{"no IVSHMEM= in: " + r->output};
  return std::atoi(r->output.c_str() + at + 8);
}

// The guest's ACPI hotplug handler runs after DEVICE_ADDED (QEMU's side is
// done then); under TCG on a loaded host it can take a while.
Result<int> WaitGuestIvshmemCount(TestDomain& domain, int expected) {
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (true) {
    Result<int> n = GuestIvshmemCount(domain);
    if (!n.ok() || *n == expected || std::chrono::steady_clock::now() > deadline) return n;
    std::this_thread::sleep_for(200ms);
  }
}

Status Crash(TestDomain& domain) { return domain.console().Send("echo c > /proc/sysrq-trigger\n"); }

Status WriteBootMarkers(TestDomain& domain, const std::string& prefix, int count) {
  Result<hostd::GuestConsole::CommandResult> r =
      domain.console().Run("for i in $(seq 1 " + std::to_string(count) + "); do echo " + prefix +
                               "-$i > " + kBootMarker + "; done",
                           kCommandTimeout);
  if (!r.ok()) return r.error();
  if (r->status != 0) return Error{"writing markers failed: " + r->output};
  return {};
}

// `hvtrace status NAME --json` until the VM runs under the libvirt backend.
Result<json> WaitServed(const HvtracedProcess& hvt, const std::string& name,
                        std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    Result<json> s = hvt.HvtraceJson({"status", name});
    if (s.ok() && (*s)["kind"] == "libvirt" && (*s)["state"] == "running") return s;
    last = s.ok() ? s->dump() : s.error().message;
    std::this_thread::sleep_for(200ms);
  }
  return Error{"VM " + name + " not served within " + std::to_string(timeout.count()) +
               " ms; last status: " + last + "\nhvtraced log:\n" + hvt.LogTail()};
}

json ReadManifest(const std::string& capture_dir) {
  return json::parse(ReadWhole(capture_dir + "/manifest.json"), nullptr, false);
}

// A domain from `hvtrace domain-xml`: the guest kernel's persistent ring
// buffer lives in the libvirt-made node-1 file from early boot. hvtraced is
// started while libvirtd is down (and says so), connects when it comes up,
// adopts the domain by name, is itself restarted (and re-adopts it), and
// captures the panic under <on_crash>destroy</on_crash> with the early-boot
// events decoded: `hvtrace show` prints initcalls and the guest's markers.
TEST(LibvirtE2e, BootRangeDomainServedByHvtracedCapturesEarlyBoot) {
  LV_SKIP_UNLESS_AVAILABLE();
  Result<GuestImage> image = FindGuestImage("6.12");
  LV_ASSERT_OK(image);
  LV_ASSERT_OK(HarvestFormats(*image));
  Result<std::unique_ptr<PrivateLibvirtd>> libvirtd = PrivateLibvirtd::Start("boot");
  LV_ASSERT_OK(libvirtd);
  PrivateLibvirtd& lv = **libvirtd;

  // libvirtd down when hvtraced starts: not fatal, reported, retried.
  LV_ASSERT_OK(lv.StopLibvirtd());
  HvtracedProcess hvt({.tag = "boot", .libvirt_uri = lv.uri()});
  LV_ASSERT_OK(hvt.Start());
  Result<json> down = hvt.WaitForLibvirt(
      [](const json& l) { return l["connected"] == false && l["error"].is_string(); }, 10s);
  ASSERT_TRUE(down.ok()) << down.error().message;
  EXPECT_THAT((*down)["error"].get<std::string>(), HasSubstr(lv.socket_path()));
  RunResult early = hvt.Hvtrace({"adopt", "whatever"});
  EXPECT_EQ(early.status, 1) << early.output;
  EXPECT_THAT(early.output, HasSubstr("not connected"));
  EXPECT_THAT(early.output, HasSubstr(lv.socket_path()));
  auto t0 = std::chrono::steady_clock::now();
  LV_ASSERT_OK(lv.StartLibvirtd());
  Result<json> up = hvt.WaitForLibvirt([](const json& l) { return l["connected"] == true; }, 30s);
  ASSERT_TRUE(up.ok()) << up.error().message;
  std::printf(
      "[ metric ] libvirtd started -> hvtraced connected: %.0f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());

  TestDomain domain(lv, "boot");
  Result<std::string> xml = BootRangeXml(domain, *image, "destroy");
  LV_ASSERT_OK(xml);
  TestDomainOptions options;
  options.raw_xml = *xml;
  options.via_virsh = true;
  Status created = domain.Create(*image, options);
  ASSERT_TRUE(created.ok()) << created.error().message << "\n" << *xml;

  Result<json> adopted = hvt.HvtraceJson({"adopt", domain.name()});
  ASSERT_TRUE(adopted.ok()) << adopted.error().message << "\n" << hvt.LogTail();
  EXPECT_EQ((*adopted)["domain"], domain.name());
  EXPECT_EQ((*adopted)["region"]["kind"], "boot-range");
  EXPECT_EQ((*adopted)["region"]["size"], 16u << 20);
  EXPECT_THAT((*adopted)["region"]["path"].get<std::string>(), HasSubstr(lv.dir() + "/ram/"));
  EXPECT_EQ((*adopted)["kernel"], image->kernel);
  LV_ASSERT_OK(WriteBootMarkers(domain, "hvt-lv-boot", 10));

  // A restarted hvtraced finds the domain in its state dir and serves it again.
  hvt.Stop();
  LV_ASSERT_OK(hvt.Start());
  Result<json> served = WaitServed(hvt, domain.name(), 30s);
  ASSERT_TRUE(served.ok()) << served.error().message;
  EXPECT_EQ((*served)["backend"]["region"]["kind"], "boot-range");
  LV_ASSERT_OK(WriteBootMarkers(domain, "hvt-lv-after", 3));

  LV_ASSERT_OK(Crash(domain));
  Result<json> captures = hvt.WaitForCaptures(domain.name(), 1, 90s);
  ASSERT_TRUE(captures.ok()) << captures.error().message << "\n" << domain.Diagnostics();
  const std::string path = (*captures)["captures"][0]["path"];
  json manifest = ReadManifest(path);
  ASSERT_TRUE(manifest.is_object()) << path;
  EXPECT_EQ(manifest["trigger"], "panic");
  // <on_crash>destroy</on_crash>: libvirt destroys QEMU milliseconds after
  // CRASHED, so the capture may run before or after; the manifest says which,
  // and the bytes are the same either way (the region file is held open).
  const json& transport = manifest["extra"]["transport"];
  const bool gone = transport["state_at_capture"].get<std::string>().starts_with("shut off");
  EXPECT_EQ(transport["panic"]["outcome"], gone ? "destroyed" : "preserved") << manifest.dump(2);
  ExpectBootRangeManifestLayout(manifest, "libvirt");
  EXPECT_EQ(manifest["validation"]["reader"], "boot_map");
  EXPECT_EQ(manifest["kernel"]["path"], image->kernel);
  ASSERT_TRUE(fs::exists(path + "/boot-0.trace.dat")) << manifest.dump(2);
  // Decoded with the daemon's FormatsService (loaded once, at adopt), as
  // captures of QEMUs hvtraced booted are.
  EXPECT_EQ(manifest["extra"]["formats"]["decoded"], true) << manifest["extra"].dump(2);
  EXPECT_EQ(manifest["extra"]["formats"]["state"], "cached") << manifest["extra"].dump(2);
  std::printf(
      "[ metric ] libvirt boot-range panic capture: %s events; callback %.2f ms after "
      "CRASHED/PANICKED (state at capture: %s)\n",
      manifest["totals"]["events"].dump().c_str(),
      manifest["extra"]["transport"]["panic"]["event_to_callback_ms"].get<double>(),
      manifest["extra"]["transport"]["state_at_capture"].get<std::string>().c_str());

  // What a user reads: early boot (initcalls) through the last marker.
  RunResult show = RunArgvStatus({BinPath("hvtrace"), "show", path});
  ASSERT_EQ(show.status, 0) << show.output.substr(0, 4000);
  EXPECT_THAT(show.output, HasSubstr("initcall_start"));
  EXPECT_THAT(show.output, HasSubstr("initcall_finish"));
  EXPECT_THAT(show.output, HasSubstr("hvt-lv-boot-10"));
  EXPECT_THAT(show.output, HasSubstr("hvt-lv-after-3"));
  size_t initcalls = 0;
  for (size_t at = 0; (at = show.output.find("initcall_finish", at)) != std::string::npos; ++at)
    ++initcalls;
  std::printf("[ metric ] hvtrace show: %zu bytes of text, %zu initcall_finish events\n",
              show.output.size(), initcalls);

  // `hvtrace stop DOMAIN` lets the domain go: the daemon stays up (it once
  // died here) and lists it offline with its capture, also after a restart,
  // which does not re-adopt it.
  RunResult stop = hvt.Hvtrace({"stop", domain.name()});
  ASSERT_EQ(stop.status, 0) << stop.output << "\n" << hvt.LogTail();
  for (int run = 0; run < 2; ++run) {
    if (run == 1) {
      EXPECT_GE(hvt.Stop(), 0) << hvt.LogTail();
      LV_ASSERT_OK(hvt.Start());
    }
    Result<json> status = hvt.HvtraceJson({"status", domain.name()});
    ASSERT_TRUE(status.ok()) << status.error().message << "\n" << hvt.LogTail();
    EXPECT_EQ((*status)["state"], "offline") << status->dump(2);
    Result<json> listed = hvt.HvtraceJson({"captures", domain.name()});
    ASSERT_TRUE(listed.ok()) << listed.error().message;
    EXPECT_EQ((*listed)["captures"].size(), 1u) << listed->dump(2);
  }
}

// <on_crash>preserve</on_crash> and a libvirtd restart while the domain runs:
// hvtraced's connection comes back by itself and the next panic is captured,
// QEMU still there (paused, "crashed").
TEST(LibvirtE2e, LibvirtdRestartThenPanicWithOnCrashPreserve) {
  LV_SKIP_UNLESS_AVAILABLE();
  Result<GuestImage> image = FindGuestImage("6.12");
  LV_ASSERT_OK(image);
  Result<std::unique_ptr<PrivateLibvirtd>> libvirtd = PrivateLibvirtd::Start("pres");
  LV_ASSERT_OK(libvirtd);
  PrivateLibvirtd& lv = **libvirtd;
  HvtracedProcess hvt({.tag = "pres", .libvirt_uri = lv.uri()});
  LV_ASSERT_OK(hvt.Start());
  ASSERT_TRUE(hvt.WaitForLibvirt([](const json& l) { return l["connected"] == true; }, 30s).ok());

  TestDomain domain(lv, "pres");
  Result<std::string> xml = BootRangeXml(domain, *image, "preserve");
  LV_ASSERT_OK(xml);
  TestDomainOptions options;
  options.raw_xml = *xml;
  options.via_virsh = true;
  Status created = domain.Create(*image, options);
  ASSERT_TRUE(created.ok()) << created.error().message;
  Result<json> adopted = hvt.HvtraceJson({"adopt", domain.name()});
  ASSERT_TRUE(adopted.ok()) << adopted.error().message;

  auto t0 = std::chrono::steady_clock::now();
  LV_ASSERT_OK(lv.RestartLibvirtd());
  Result<json> back = hvt.WaitForLibvirt(
      [](const json& l) { return l["connected"] == true && l.value("reconnects", 0) >= 1; }, 60s);
  ASSERT_TRUE(back.ok()) << back.error().message << "\n" << lv.LogTail();
  std::printf(
      "[ metric ] libvirtd restart -> hvtraced reconnected: %.0f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());

  LV_ASSERT_OK(WriteBootMarkers(domain, "hvt-lv-pres", 5));
  LV_ASSERT_OK(Crash(domain));
  Result<json> captures = hvt.WaitForCaptures(domain.name(), 1, 90s);
  ASSERT_TRUE(captures.ok()) << captures.error().message << "\n" << domain.Diagnostics();
  const std::string path = (*captures)["captures"][0]["path"];
  json manifest = ReadManifest(path);
  EXPECT_EQ(manifest["trigger"], "panic");
  const json& panic = manifest["extra"]["transport"]["panic"];
  EXPECT_EQ(panic["outcome"], "preserved") << manifest.dump(2);
  // The guest's kernel log through libvirt's memory peek and the KASLR
  // search (reader "backend": hvtraced maps no guest RAM of a libvirt domain).
  const json& kernel_log = manifest["extra"]["kernel_log"];
  EXPECT_EQ(kernel_log.value("source", ""), "printk-ring") << kernel_log.dump(2);
  EXPECT_EQ(kernel_log.value("reader", ""), "backend") << kernel_log.dump(2);
  // The marker is in the capture (region.bin and, with formats, trace.dat).
  bool in_trace = false;
  for (const auto& e : fs::directory_iterator(path)) {
    if (ReadWhole(e.path().string()).find("hvt-lv-pres-5") != std::string::npos) in_trace = true;
  }
  EXPECT_TRUE(in_trace) << "marker hvt-lv-pres-5 in no file of " << path;
  Result<std::string> state = RunArgv({"virsh", "-q", "-c", lv.uri(), "domstate", domain.name()});
  LV_ASSERT_OK(state);
  EXPECT_THAT(*state, HasSubstr("crashed"));  // libvirt 9.0 keeps QEMU, stopped by pvpanic.
  std::printf(
      "[ metric ] on_crash=preserve after libvirtd restart: callback %.2f ms after "
      "CRASHED/PANICKED; state at capture: %s\n",
      panic["event_to_callback_ms"].get<double>(),
      manifest["extra"]["transport"]["state_at_capture"].get<std::string>().c_str());

  // hvtraced restarted while the domain sits crashed: no event will come, so
  // the re-adopted backend looks, finds the domain still in the panic the
  // first capture holds (its region is byte-identical) and takes no second
  // capture of it.
  const std::string first_id = (*captures)["captures"][0]["id"];
  hvt.Stop();
  LV_ASSERT_OK(hvt.Start());
  const std::string same = "found panicked, in the panic capture " + first_id + " holds";
  EXPECT_TRUE(hvt.WaitForLog(same, 60s)) << hvt.LogTail();
  Result<json> again = hvt.HvtraceJson({"captures", domain.name()});
  LV_ASSERT_OK(again);
  EXPECT_EQ((*again)["captures"].size(), 1u) << again->dump(2);
}

// The 6.12 guest image with this build's hvtrace-agent and
// hvtrace-guest-test (build-guest.sh caches it; the same image attach_e2e.cc
// uses).
Result<GuestImage> ImageWithAgent() {
  const std::string out = std::string(HVTRACE_BIN_DIR) + "/../guest-attach";
  std::vector<std::string> argv = {std::string(HVTRACE_SOURCE_DIR) + "/qemu-scripts/build-guest.sh",
                                   "--kernel",
                                   "6.12",
                                   "--out",
                                   out,
                                   "--agent",
                                   BinPath("hvtrace-agent")};
  // The test tools (dw-write) come along when they are built.
  if (access(BinPath("hvtrace-guest-test").c_str(), X_OK) == 0) {
    argv.insert(argv.end(), {"--guest-test", BinPath("hvtrace-guest-test")});
  }
  Result<std::string> built = RunArgv(argv);
  if (!built.ok()) return built.error();
  GuestImage image;
  std::istringstream lines(*built);
  std::string line;
  while (std::getline(lines, line)) {
    char kernel[1024], initrd[1024], release[256];
    if (std::sscanf(line.c_str(), "GUEST 6.12 KERNEL=%1023s INITRD=%1023s RELEASE=%255s", kernel,
                    initrd, release) == 3) {
      image = {kernel, initrd, release};
    }
  }
  if (image.kernel.empty()) return Error{"build-guest.sh printed no GUEST line:\n" + *built};
  return image;
}

// What a failed attach test needs to see: the domain's console and
// libvirtd's log, the guest agent's log and hvtraced's.
std::string AttachDiagnostics(TestDomain& domain, HvtracedProcess& hvt) {
  auto log = domain.console().Run("cat /tmp/agent.log; ps", kCommandTimeout);
  return domain.Diagnostics() + "\n--- agent ---\n" + (log.ok() ? log->output : "") +
         "\n--- hvtraced ---\n" + hvt.LogTail();
}

// Attach mode for a domain, through hvtraced: `hvtrace attach NAME` makes the
// region (header, QEMU's owner), hot-plugs it as <shmem> and waits for the
// guest agent; `hvtrace stream NAME` shows the guest's markers (trace_marker
// and direct-write); a panic under <on_crash>destroy</on_crash> is captured
// from the mapping hvtraced holds, and `hvtrace show` prints the events,
// the last ones written right before the panic included.
TEST(LibvirtE2e, AttachStreamThenPanicWithOnCrashDestroy) {
  LV_SKIP_UNLESS_AVAILABLE();
  if (access(BinPath("hvtrace-agent").c_str(), X_OK) != 0)
    GTEST_SKIP() << "hvtrace-agent not built";
  Result<GuestImage> image = ImageWithAgent();
  LV_ASSERT_OK(image);
  Result<std::unique_ptr<PrivateLibvirtd>> libvirtd = PrivateLibvirtd::Start("dest");
  LV_ASSERT_OK(libvirtd);
  PrivateLibvirtd& lv = **libvirtd;
  HvtracedProcess hvt({.tag = "dest", .libvirt_uri = lv.uri()});
  LV_ASSERT_OK(hvt.Start());
  ASSERT_TRUE(hvt.WaitForLibvirt([](const json& l) { return l["connected"] == true; }, 30s).ok());
  TestDomain domain(lv, "dest");
  TestDomainOptions options;
  options.on_crash = "destroy";
  options.via_virsh = true;
  Status created = domain.Create(*image, options);
  ASSERT_TRUE(created.ok()) << created.error().message;
  ShmCleanup cleanup;
  const std::string region_file = "/dev/shm/hvtrace-" + domain.name() + "-attach";
  cleanup.paths.push_back(region_file);
  auto agent = domain.console().Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)", kCommandTimeout);
  LV_ASSERT_OK(agent);
  auto diag = [&] { return AttachDiagnostics(domain, hvt); };

  Result<json> attached = hvt.HvtraceJson({"attach", domain.name(), "--wait-ms", "60000"});
  ASSERT_TRUE(attached.ok()) << attached.error().message << diag();
  ASSERT_FALSE((*attached)["guest"].is_null()) << attached->dump(2) << diag();
  EXPECT_EQ((*attached)["guest"]["kernel_release"], image->release);
  EXPECT_EQ((*attached)["region"]["file"], region_file);
  EXPECT_EQ((*attached)["device"]["id"], "ua-hvtrace-hvtrace-" + domain.name() + "-attach");
  std::printf(
      "[ metric ] libvirt attach through hvtraced: plugged in %.1f ms (DEVICE_ADDED %.1f ms), "
      "agent announced %.1f ms later\n",
      (*attached)["plug_ms"].get<double>(),
      (*attached)["transport"]["device_added_ms"].get<double>(),
      (*attached)["announce_ms"].get<double>());
  Result<int> seen = WaitGuestIvshmemCount(domain, 1);
  LV_ASSERT_OK(seen);
  EXPECT_EQ(*seen, 1);
  // A second attach is refused while one is plugged.
  RunResult twice = hvt.Hvtrace({"attach", domain.name(), "--wait-ms", "0"});
  EXPECT_NE(twice.status, 0);
  EXPECT_THAT(twice.output, HasSubstr("already attached"));

  StreamReader stream(hvt, domain.name());
  ASSERT_TRUE(stream.WaitForNote("streaming VM", 10s)) << stream.output() << diag();
  std::this_thread::sleep_for(500ms);  // The stream's first look is taken.
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(domain.console()
                .Run("echo HVT-LV-K1 > /sys/kernel/tracing/instances/hvtrace/trace_marker",
                     kCommandTimeout)
                ->status,
            0);
  auto dw =
      domain.console().Run("hvtrace-guest-test dw-write --count 3 HVT-LV-DW", kCommandTimeout);
  ASSERT_TRUE(dw.ok() && dw->status == 0) << (dw.ok() ? dw->output : dw.error().message);
  ASSERT_TRUE(stream.WaitForAll({"HVT-LV-K1", "HVT-LV-DW 2"}, 30s)) << stream.output() << diag();
  std::printf(
      "[ metric ] markers written -> shown by `hvtrace stream`: %.0f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  const std::string text = stream.text();
  EXPECT_LT(text.find("HVT-LV-K1"), text.find("HVT-LV-DW 0")) << text;
  EXPECT_LT(text.find("HVT-LV-DW 0"), text.find("HVT-LV-DW 2")) << text;

  LV_ASSERT_OK(
      domain.console().Send("hvtrace-guest-test dw-write --count 2 HVT-LV-LAST > /dev/null; echo c "
                            "> /proc/sysrq-trigger\n"));
  Result<json> captures = hvt.WaitForCaptures(domain.name(), 1, 60s);
  ASSERT_TRUE(captures.ok()) << captures.error().message << diag();
  const std::string path = (*captures)["captures"][0]["path"];
  json manifest = ReadManifest(path);
  EXPECT_EQ(manifest["trigger"], "panic");
  EXPECT_EQ(manifest["region"]["kind"], "attach") << manifest.dump(2);
  EXPECT_EQ(manifest["extra"]["transport"]["on_crash"], "destroy");
  // <on_crash>destroy</on_crash>: libvirt destroys QEMU milliseconds after
  // CRASHED, so the capture may run before or after; the manifest says which,
  // and the bytes are the same either way (the region file is held open).
  const json& transport = manifest["extra"]["transport"];
  const bool gone = transport["state_at_capture"].get<std::string>().starts_with("shut off");
  EXPECT_EQ(transport["panic"]["outcome"], gone ? "destroyed" : "preserved") << manifest.dump(2);
  RunResult show = RunArgvStatus({BinPath("hvtrace"), "show", path});
  ASSERT_EQ(show.status, 0) << show.output.substr(0, 4000);
  EXPECT_THAT(show.output, HasSubstr("HVT-LV-K1"));
  EXPECT_THAT(show.output, HasSubstr("HVT-LV-DW 2"));
  EXPECT_THAT(show.output, HasSubstr("HVT-LV-LAST 1"))
      << "direct-write events right before the panic must be in the capture";
  // libvirt never deletes a shmem file.
  EXPECT_TRUE(fs::exists(region_file));
  std::printf("[ metric ] on_crash=destroy (attach): capture %s, state at copy: %s\n",
              (*captures)["captures"][0]["id"].get<std::string>().c_str(),
              manifest["extra"]["transport"]["state_at_capture"].get<std::string>().c_str());
}

// The one capture directory an hvtraced that died mid-capture left
// (".tmp-*"), once it is checked to hold the attach region's copy and the
// recovery record of a libvirt panic capture.
void FindIncompleteAttachCapture(const fs::path& captures, uint64_t region_size, fs::path* found) {
  std::vector<fs::path> incomplete;
  std::string listing;
  for (const auto& e : fs::directory_iterator(captures)) {
    listing += e.path().filename().string() + " ";
    if (e.path().filename().string().starts_with(".tmp-")) incomplete.push_back(e.path());
  }
  ASSERT_EQ(incomplete.size(), 1u) << "in " << captures << ": " << listing;
  const fs::path& dir = incomplete[0];
  ASSERT_TRUE(fs::exists(dir / "attach-region.bin")) << dir;
  EXPECT_EQ(fs::file_size(dir / "attach-region.bin"), region_size);
  EXPECT_FALSE(fs::exists(dir / "region.bin")) << "an attach-only domain has no region file";
  const json record = json::parse(ReadWhole(dir / "recovery.json"), nullptr, false);
  ASSERT_TRUE(record.is_object()) << dir / "recovery.json";
  EXPECT_EQ(record["format"], "hvtrace-capture-recovery");
  EXPECT_EQ(record["manifest"]["trigger"], "panic") << record.dump(2);
  EXPECT_EQ(record["manifest"]["region"]["kind"], "attach") << record.dump(2);
  EXPECT_EQ(record["manifest"]["extra"]["transport"]["kind"], "libvirt") << record.dump(2);
  *found = dir;
}

// Waits until the guest agent's log says it published the kernel's symbols.
bool AgentPublishedSymbols(TestDomain& domain) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = domain.console().Run("grep -q 'symbols: ' /tmp/agent.log", kCommandTimeout);
    if (r.ok() && r->status == 0) return true;
    std::this_thread::sleep_for(500ms);
  }
  return false;
}

// Attach mode for a domain whose hvtraced dies in the middle of the panic
// capture: the daemon (hvtraced-crash-after-region, tests/tools/) SIGKILLs
// itself once attach-region.bin and the recovery record are durable. The
// next hvtraced finishes that capture at start-up: recovered, the libvirt
// transport kept, the guest's markers decoded, and the temporary directory
// gone.
TEST(LibvirtE2e, DaemonDiesMidAttachPanicCaptureThenTheNextRunRecoversIt) {
  LV_SKIP_UNLESS_AVAILABLE();
  if (access(BinPath("hvtrace-agent").c_str(), X_OK) != 0)
    GTEST_SKIP() << "hvtrace-agent not built";
  Result<GuestImage> image = ImageWithAgent();
  LV_ASSERT_OK(image);
  Result<std::unique_ptr<PrivateLibvirtd>> libvirtd = PrivateLibvirtd::Start("rec");
  LV_ASSERT_OK(libvirtd);
  PrivateLibvirtd& lv = **libvirtd;
  HvtracedProcess hvt(
      {.tag = "rec", .libvirt_uri = lv.uri(), .binary = "hvtraced-crash-after-region"});
  LV_ASSERT_OK(hvt.Start());
  ASSERT_TRUE(hvt.WaitForLibvirt([](const json& l) { return l["connected"] == true; }, 30s).ok());
  TestDomain domain(lv, "rec");
  TestDomainOptions options;
  options.on_crash = "destroy";
  options.via_virsh = true;
  Status created = domain.Create(*image, options);
  ASSERT_TRUE(created.ok()) << created.error().message;
  ShmCleanup cleanup;
  cleanup.paths.push_back("/dev/shm/hvtrace-" + domain.name() + "-attach");
  LV_ASSERT_OK(domain.console().Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)", kCommandTimeout));
  auto diag = [&] { return AttachDiagnostics(domain, hvt); };
  Result<json> attached = hvt.HvtraceJson({"attach", domain.name(), "--wait-ms", "60000"});
  ASSERT_TRUE(attached.ok()) << attached.error().message << diag();
  ASSERT_FALSE((*attached)["guest"].is_null()) << attached->dump(2) << diag();
  // The agent publishes the kernel's symbols a few seconds after it attached;
  // the recovered capture must name the marker's function with them.
  ASSERT_TRUE(AgentPublishedSymbols(domain)) << "no symbols published\n" << diag();

  // Markers through both paths, seen live before the panic.
  StreamReader stream(hvt, domain.name());
  ASSERT_TRUE(stream.WaitForNote("streaming VM", 10s)) << stream.output() << diag();
  std::this_thread::sleep_for(500ms);  // The stream's first look is taken.
  auto wrote = domain.console().Run(
      "echo HVT-RC-K1 > /sys/kernel/tracing/instances/hvtrace/trace_marker && "
      "hvtrace-guest-test dw-write --count 3 HVT-RC-DW",
      kCommandTimeout);
  ASSERT_TRUE(wrote.ok() && wrote->status == 0) << (wrote.ok() ? wrote->output : "") << diag();
  ASSERT_TRUE(stream.WaitForAll({"HVT-RC-K1", "HVT-RC-DW 2"}, 30s)) << stream.output() << diag();

  LV_ASSERT_OK(
      domain.console().Send("hvtrace-guest-test dw-write --count 2 HVT-RC-LAST > /dev/null; echo c "
                            "> /proc/sysrq-trigger\n"));
  Result<int> died = hvt.WaitExit(60s);
  ASSERT_TRUE(died.ok()) << died.error().message << diag();
  ASSERT_TRUE(WIFSIGNALED(*died) && WTERMSIG(*died) == SIGKILL)
      << "wait status " << *died << diag();
  const fs::path captures = hvt.captures_dir(domain.name());
  fs::path incomplete;
  ASSERT_NO_FATAL_FAILURE(FindIncompleteAttachCapture(
      captures, (*attached)["region"]["size"].get<uint64_t>(), &incomplete));

  hvt.SetBinary("hvtraced");
  LV_ASSERT_OK(hvt.Start());
  Result<json> recovered = hvt.WaitForCapture(domain.name(), "panic", 60s);
  ASSERT_TRUE(recovered.ok()) << recovered.error().message << "\n" << hvt.LogTail();
  const std::string id = (*recovered)["id"];
  // The log line follows the commit that made the capture visible.
  EXPECT_TRUE(hvt.WaitForLog("recovered capture " + id, 10s)) << hvt.LogTail();
  const json manifest = ReadManifest((captures / id).string());
  ASSERT_TRUE(manifest.is_object()) << captures / id;
  EXPECT_TRUE(manifest["recovered"].is_object()) << manifest.dump(2);
  EXPECT_EQ(manifest["trigger"], "panic");
  EXPECT_EQ(manifest["region"]["kind"], "attach") << manifest.dump(2);
  EXPECT_EQ(manifest["extra"]["transport"]["kind"], "libvirt") << manifest.dump(2);
  EXPECT_EQ(manifest["extra"]["transport"]["domain"], domain.name());
  EXPECT_FALSE(fs::exists(captures / id / "recovery.json"));
  EXPECT_FALSE(fs::exists(incomplete)) << incomplete;
  EXPECT_GT(manifest["extra"]["attach"]["names"]["per_generation"]["1"]["symbols"].get<uint64_t>(),
            10000u)
      << manifest["extra"]["attach"]["names"].dump(2);
  RunResult show = RunArgvStatus({BinPath("hvtrace"), "show", (captures / id).string()});
  ASSERT_EQ(show.status, 0) << show.output.substr(0, 4000);
  for (const char* marker :
       {"tracing_mark_write: HVT-RC-K1", "text=HVT-RC-DW 2", "text=HVT-RC-LAST 1"}) {
    EXPECT_THAT(show.output, HasSubstr(marker)) << "not in the recovered capture";
  }
  Result<json> listed = hvt.HvtraceJson({"captures", domain.name()});
  LV_ASSERT_OK(listed);
  EXPECT_EQ((*listed)["captures"].size(), 1u) << listed->dump(2);
  std::printf("[ metric ] attach capture recovered by the next hvtraced: %s, %s events\n",
              id.c_str(), manifest["totals"]["events"].dump().c_str());
}

// Detach through hvtraced trusts only DEVICE_REMOVED; the guest's agent lets
// go, and a second attach plugs a fresh region the agent maps again. The old
// `hvtrace libvirt-attach/-detach` spellings (once a libvirt client in the
// CLI) still work, through hvtraced, with their old flags ignored.
TEST(LibvirtE2e, DetachWaitsForDeviceRemovedThenReattach) {
  LV_SKIP_UNLESS_AVAILABLE();
  if (access(BinPath("hvtrace-agent").c_str(), X_OK) != 0)
    GTEST_SKIP() << "hvtrace-agent not built";
  Result<GuestImage> image = ImageWithAgent();
  LV_ASSERT_OK(image);
  Result<std::unique_ptr<PrivateLibvirtd>> libvirtd = PrivateLibvirtd::Start("det");
  LV_ASSERT_OK(libvirtd);
  PrivateLibvirtd& lv = **libvirtd;
  HvtracedProcess hvt({.tag = "det", .libvirt_uri = lv.uri()});
  LV_ASSERT_OK(hvt.Start());
  ASSERT_TRUE(hvt.WaitForLibvirt([](const json& l) { return l["connected"] == true; }, 30s).ok());
  TestDomain domain(lv, "det");
  TestDomainOptions options;
  options.via_virsh = true;
  Status created = domain.Create(*image, options);
  ASSERT_TRUE(created.ok()) << created.error().message;
  ShmCleanup cleanup;
  const std::string region_file = "/dev/shm/hvtrace-" + domain.name() + "-attach";
  cleanup.paths.push_back(region_file);
  LV_ASSERT_OK(domain.console().Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)", kCommandTimeout));

  auto diag = [&] { return AttachDiagnostics(domain, hvt); };
  Result<json> first = hvt.HvtraceJson({"attach", domain.name(), "--wait-ms", "60000"});
  ASSERT_TRUE(first.ok()) << first.error().message << diag();
  ASSERT_FALSE((*first)["guest"].is_null()) << first->dump(2) << diag();
  Result<int> seen = WaitGuestIvshmemCount(domain, 1);
  LV_ASSERT_OK(seen);
  EXPECT_EQ(*seen, 1);
  Result<json> detached = hvt.HvtraceJson({"detach", domain.name()});
  ASSERT_TRUE(detached.ok()) << detached.error().message << "\n" << domain.Diagnostics();
  EXPECT_EQ((*detached)["detached"], true);
  std::printf("[ metric ] hvtrace detach -> DEVICE_REMOVED: %.1f ms\n",
              (*detached)["device_deleted_ms"].get<double>());
  seen = WaitGuestIvshmemCount(domain, 0);
  LV_ASSERT_OK(seen);
  EXPECT_EQ(*seen, 0);
  RunResult again_detach = hvt.Hvtrace({"detach", domain.name()});
  EXPECT_NE(again_detach.status, 0);
  EXPECT_THAT(again_detach.output, HasSubstr("no region is attached"));
  // libvirt drops QEMU's memory backend after DEVICE_REMOVED; wait for it.
  auto unmapped_by = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < unmapped_by) {
    std::optional<std::string> user = hostd::FindMapper(region_file);
    if (!user || user->find("qemu") == std::string::npos) break;
    std::this_thread::sleep_for(100ms);
  }
  Result<json> second = hvt.HvtraceJson({"attach", domain.name(), "--wait-ms", "60000"});
  ASSERT_TRUE(second.ok()) << second.error().message << "\n" << hvt.LogTail();
  ASSERT_FALSE((*second)["guest"].is_null()) << second->dump(2);
  EXPECT_NE((*second)["region"]["region_id"], (*first)["region"]["region_id"]);

  // The guest ejects the device itself (ACPI hot-plug slot power off): the
  // DEVICE_REMOVED nobody asked for still marks the domain detached.
  seen = WaitGuestIvshmemCount(domain, 1);
  LV_ASSERT_OK(seen);
  LV_ASSERT_OK(domain.console().Run(
      "for s in /sys/bus/pci/slots/*; do a=$(cat $s/address); "
      "grep -qs 0x1110 /sys/bus/pci/devices/$a.0/device && echo 0 > $s/power; done; true",
      kCommandTimeout));
  seen = WaitGuestIvshmemCount(domain, 0);
  LV_ASSERT_OK(seen);
  EXPECT_EQ(*seen, 0);
  bool marked_detached = false;
  for (auto by = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < by;) {
    Result<json> st = hvt.HvtraceJson({"status", domain.name()});
    if (st.ok() && st->contains("attach") && (*st)["attach"]["attached"] == false) {
      marked_detached = true;
      break;
    }
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_TRUE(marked_detached) << "a guest-side eject left the domain attached\n" << hvt.LogTail();
  RunResult after_eject = hvt.Hvtrace({"detach", domain.name()});
  EXPECT_NE(after_eject.status, 0);
  EXPECT_THAT(after_eject.output, HasSubstr("no region is attached"));

  // The old spellings, now hidden names of attach/detach through hvtraced.
  unmapped_by = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < unmapped_by) {
    std::optional<std::string> user = hostd::FindMapper(region_file);
    if (!user || user->find("qemu") == std::string::npos) break;
    std::this_thread::sleep_for(100ms);
  }
  RunResult old_attach = hvt.Hvtrace({"libvirt-attach", domain.name(), "--shm", ShmName("det"),
                                      "--uri", lv.uri(), "--size", "4M", "--timeout-ms", "60000"});
  ASSERT_EQ(old_attach.status, 0) << old_attach.output << "\n" << hvt.LogTail();
  EXPECT_THAT(old_attach.output, HasSubstr("ignored"));
  EXPECT_THAT(old_attach.output, HasSubstr(region_file));
  RunResult old_detach = hvt.Hvtrace({"libvirt-detach", domain.name(), "--shm", ShmName("det")});
  ASSERT_EQ(old_detach.status, 0) << old_detach.output;
  EXPECT_THAT(old_detach.output, HasSubstr("unplugged"));
}

// What a user sees when something is wrong: names, URIs and reasons.
TEST(LibvirtE2e, ClearErrors) {
  LV_SKIP_UNLESS_AVAILABLE();
  Result<GuestImage> image = FindGuestImage("6.12");
  LV_ASSERT_OK(image);
  Result<std::unique_ptr<PrivateLibvirtd>> libvirtd = PrivateLibvirtd::Start("err");
  LV_ASSERT_OK(libvirtd);
  PrivateLibvirtd& lv = **libvirtd;
  HvtracedProcess hvt({.tag = "err", .libvirt_uri = lv.uri()});
  LV_ASSERT_OK(hvt.Start());
  ASSERT_TRUE(hvt.WaitForLibvirt([](const json& l) { return l["connected"] == true; }, 30s).ok());

  // Unknown domain: its name, the URI and libvirt's reason.
  RunResult unknown = hvt.Hvtrace({"adopt", "no-such-domain"});
  EXPECT_EQ(unknown.status, 1);
  EXPECT_THAT(unknown.output, HasSubstr("'no-such-domain'"));
  EXPECT_THAT(unknown.output, HasSubstr(lv.socket_path()));
  EXPECT_THAT(unknown.output, HasSubstr("Domain not found"));
  // The daemon is fine and knows no such VM.
  EXPECT_EQ(hvt.Hvtrace({"ping"}).status, 0);
  RunResult status = hvt.Hvtrace({"status", "no-such-domain"});
  EXPECT_NE(status.status, 0);

  // A defined but inactive domain.
  TestDomain idle(lv, "idle");
  TestDomainOptions io;
  io.start = false;
  io.via_virsh = true;
  ASSERT_TRUE(idle.Create(*image, io).ok());
  RunResult inactive = hvt.Hvtrace({"adopt", idle.name()});
  EXPECT_EQ(inactive.status, 1);
  EXPECT_THAT(inactive.output, HasSubstr("not running"));
  EXPECT_THAT(inactive.output, HasSubstr(idle.name()));

  // q35 without a spare pcie-root-port: refused before touching libvirt's
  // device list. libvirt 9.0 gives a q35 domain one spare port on its own
  // (verified); a definition with no PCI device behind a port gets none.
  TestDomain q35(lv, "q35");
  TestDomainOptions qo;
  qo.machine = "q35";
  qo.via_virsh = true;
  qo.extra_devices = "    <controller type='usb' model='none'/>\n";
  ASSERT_TRUE(q35.Create(*image, qo).ok());
  RunResult no_bus = hvt.Hvtrace({"attach", q35.name(), "--wait", "0"});
  EXPECT_EQ(no_bus.status, 1);
  EXPECT_THAT(no_bus.output, HasSubstr("no hot-pluggable PCI bus"));
  EXPECT_THAT(no_bus.output, HasSubstr("pcie-root-port"));
  EXPECT_THAT(no_bus.output, HasSubstr(q35.name()));

  // A denied connection: hvtraced running as nobody cannot open libvirtd's
  // 0700 root socket. It still serves its socket and says why.
  HvtracedProcess denied({.tag = "deny", .libvirt_uri = lv.uri(), .uid = 65534});
  LV_ASSERT_OK(denied.Start());
  Result<json> refused = denied.WaitForLibvirt(
      [](const json& l) { return l["connected"] == false && l["error"].is_string(); }, 20s);
  ASSERT_TRUE(refused.ok()) << refused.error().message;
  EXPECT_THAT((*refused)["error"].get<std::string>(), HasSubstr("Permission denied"));
  EXPECT_THAT((*refused)["error"].get<std::string>(), HasSubstr(lv.socket_path()));
  RunResult adopt_denied = denied.Hvtrace({"adopt", idle.name()});
  EXPECT_EQ(adopt_denied.status, 1);
  EXPECT_THAT(adopt_denied.output, HasSubstr("Permission denied"));
  EXPECT_THAT(adopt_denied.output, Not(HasSubstr("internal")));
}

}  // namespace
}  // namespace hvtrace::e2e
