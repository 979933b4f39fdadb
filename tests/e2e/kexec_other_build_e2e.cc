// kexec from one kernel build into another of the same range layout
// (Debian's 6.12.95 from bookworm-backports into 6.12.117 from
// bookworm-security; trixie-backports' 7.3.4 into its 7.2.12), boot range, no
// agent: each boot of the capture decodes with its own kernel's formats,
// identified by the console banner and checked against the records
// (hostd/decode/boot_kernels.h), and the manifest's id table says what
// moved or changed between the builds (event_id_table.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <regex>
#include <string>

#include "attach_region_host.h"
#include "formats_cache.h"
#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "test_support.h"
#include "trace_text.h"
#include "vm_console.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kMarker = "/sys/kernel/tracing/instances/boot_map/trace_marker";

struct OtherBuild {
  std::string kernel, initrd, release;
};

// build-guest.sh --with-kexec-other: the other build of |kernel|'s
// generation (6.12: 6.12.117 beside 6.12.95; 7.3: 7.2.12 beside 7.3.4) and
// the initramfs that carries it at /boot/vmlinuz (cached after the first run).
Result<OtherBuild> FindOtherBuild(const std::string& kernel) {
  const std::string cmd = std::string(HVTRACE_SOURCE_DIR) +
                          "/qemu-scripts/build-guest.sh --kernel " + kernel +
                          " --with-kexec-other 2>&1";
  const std::string out = test_support::RunCommand(cmd);
  const std::regex line("OTHER " + std::regex_replace(kernel, std::regex("\\."), "\\.") +
                        R"( KERNEL=(\S+) INITRD=(\S+) RELEASE=(\S+))");
  std::smatch m;
  if (!std::regex_search(out, m, line))
    return Error{"`" + cmd + "` printed no OTHER line:\n" + out};
  return OtherBuild{m[1], m[2], m[3]};
}

// The same images with this build's agent (and test tools) in them: GUEST
// and OTHER lines of build-guest.sh --out .../|out_dir|. |other_kernel| (7.3)
// carries that kernel for the kexec instead of the other 6.12 build; such
// images get their own |out_dir| (the file names are the same).
Result<std::pair<GuestImage, OtherBuild>> AgentImagesWithOtherBuild(
    const std::string& out_dir = "guest-attach", const std::string& other_kernel = "") {
  const std::string bin = HVTRACE_BIN_DIR;
  const std::string guest_test = bin + "/hvtrace-guest-test";
  const std::string cmd =
      std::string(HVTRACE_SOURCE_DIR) + "/qemu-scripts/build-guest.sh --kernel 6.12 --out " + bin +
      "/../" + out_dir + " --agent " + bin + "/hvtrace-agent" +
      (access(guest_test.c_str(), X_OK) == 0 ? " --guest-test " + guest_test : std::string()) +
      " --with-kexec-other" +
      (other_kernel.empty() ? std::string() : " --other-kernel " + other_kernel) + " 2>&1";
  const std::string out = test_support::RunCommand(cmd);
  static const std::regex kGuest(R"(GUEST 6\.12 KERNEL=(\S+) INITRD=(\S+) RELEASE=(\S+))");
  static const std::regex kOther(R"(OTHER 6\.12 KERNEL=(\S+) INITRD=(\S+) RELEASE=(\S+))");
  std::smatch g, o;
  if (!std::regex_search(out, g, kGuest) || !std::regex_search(out, o, kOther)) {
    return Error{"`" + cmd + "` printed no GUEST/OTHER lines:\n" + out};
  }
  return std::pair{GuestImage{g[1], g[2], g[3]}, OtherBuild{o[1], o[2], o[3]}};
}

// `hvtrace formats harvest`, as a user runs it for a kernel their VM may
// kexec into; prints the key. Into the local cache by name (--cache): with
// a daemon answering on the default socket, the CLI would ask it instead,
// and refuse the project's --initrd.
Result<std::string> Harvest(const std::string& kernel, const std::string& initrd) {
  Result<std::filesystem::path> cache = hostd::DefaultCacheRoot();
  if (!cache.ok()) return cache.error();
  test_support::CommandResult r = test_support::RunCommandStatus(
      std::string(HVTRACE_BIN_DIR) + "/hvtrace formats harvest --kernel '" + kernel +
      "' --initrd '" + initrd + "' --cache '" + cache->string() + "' 2>&1");
  if (r.status != 0) return Error{"harvest of " + kernel + " failed:\n" + r.out};
  return r.out;
}

// |pin|: a command prefix (`taskset MASK `) that keeps the writes on one CPU.
Status WriteMarkers(hostd::GuestConsole& console, const std::string& prefix, int count,
                    const std::string& pin = "") {
  const std::string cmd = pin + "sh -c 'for i in $(seq 1 " + std::to_string(count) + "); do echo " +
                          prefix + "-$i > " + kMarker + "; ls /proc > /dev/null; sleep 0.1; done'";
  auto ran = console.Run(cmd, kCommandTimeout);
  if (!ran.ok()) return ran.error();
  if (ran->status != 0) return Error{"marker loop exited " + std::to_string(ran->status)};
  return {};
}

// The formats cache entry of |release| (hvtrace formats list --json is not
// needed: the harvest printed the entry path): "system/name" -> {id, the
// format's field lines}, compared here independently of the fingerprints.
std::map<std::string, std::pair<uint32_t, std::string>> EntryEvents(const std::string& entry) {
  std::map<std::string, std::pair<uint32_t, std::string>> out;
  const json events = json::parse(test_support::ReadText(entry + "/events.json"));
  for (const json& e : events["events"]) {
    std::string text = e.value("format", "");
    std::string fields;
    for (const std::string& line : TextLines(text)) {
      if (line.find("field:") != std::string::npos) fields += line + "\n";
    }
    out[e.value("system", "") + "/" + e.value("name", "")] = {e.value("id", 0u), fields};
  }
  return out;
}

std::string EntryPath(const std::string& harvest_output) {
  static const std::regex kPath(R"(path\s+(\S+))");
  std::smatch m;
  return std::regex_search(harvest_output, m, kPath) ? std::string(m[1]) : std::string();
}

// `trace-cmd report` of boot |b|'s trace.dat in the capture |dir|.
std::string BootReport(const fs::path& dir, size_t b) {
  return test_support::RunCommand("trace-cmd report '" +
                                  (dir / ("boot-" + std::to_string(b) + ".trace.dat")).string() +
                                  "' 2>&1");
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The guest generation, and whether the new boot clears the boot instance
// after the kexec (`echo > trace`, as a user or a tool resetting it would),
// so the range holds the new boot alone; false: it appends.
struct RangeCase {
  const char* kernel;
  bool reset;
};

// Printed in test names and listings (not as the struct's raw bytes).
void PrintTo(const RangeCase& c, std::ostream* os) {
  *os << c.kernel << (c.reset ? " reset" : " append");
}

class KexecOtherBuildRangeE2e : public ::testing::TestWithParam<RangeCase> {};

TEST_P(KexecOtherBuildRangeE2e, EachBootDecodesWithItsOwnKernelsFormats) {
  const bool reset = GetParam().reset;
  const std::string kernel = GetParam().kernel;
  // 6.15+ (7.3): a kexec with the same command line takes the range over;
  // the CPUs the new boot writes on keep only its pages (docs/postmortem.md,
  // "Guest kernels"). CPU 1 keeps the old boot's, so its markers are written
  // there; the new boot's markers on CPU 0.
  const bool takes_over = kernel != "6.12";
  const std::string first_cpu = takes_over ? "taskset 2 " : "";
  const std::string second_cpu = takes_over ? "taskset 1 " : "";
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = FindGuestImage(kernel);
  ASSERT_TRUE(image.ok()) << image.error().message;
  Result<OtherBuild> other = FindOtherBuild(kernel);
  ASSERT_TRUE(other.ok()) << other.error().message;
  ASSERT_NE(other->release, image->release);
  // Both kernels' formats in the cache the daemon reads (the default one).
  std::vector<std::string> entries;
  for (const auto& [vmlinuz, initrd] :
       {std::pair{image->kernel, image->initrd}, std::pair{other->kernel, other->initrd}}) {
    Result<std::string> h = Harvest(vmlinuz, initrd);
    ASSERT_TRUE(h.ok()) << h.error().message;
    entries.push_back(EntryPath(*h));
    ASSERT_FALSE(entries.back().empty()) << *h;
  }
  // What the two builds' formats differ in, from their texts.
  size_t moved = 0, changed = 0;
  {
    auto a = EntryEvents(entries[0]);
    auto b = EntryEvents(entries[1]);
    for (const auto& [event, before] : a) {
      auto after = b.find(event);
      if (after == b.end()) continue;
      if (after->second.second != before.second) {
        ++changed;
      } else if (after->second.first != before.first) {
        ++moved;
      }
    }
    std::printf("[kexec-other] %s vs %s formats: %zu events, %zu moved, %zu changed layout\n",
                image->release.c_str(), other->release.c_str(), a.size(), moved, changed);
  }

  HvtracedProcess daemon({.tag = "kxother", .config = "vm_on_shutdown = stop\n"});
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  const std::string name = "kx-other-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(daemon, name, image->kernel, other->initrd);
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  hostd::GuestConsole& console = *guest->console;
  auto tail = [&] { return ConsoleAndLog(*guest, daemon); };
  ASSERT_TRUE(console.WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();
  ASSERT_TRUE(WriteMarkers(console, "first-mark", 6, first_cpu).ok()) << tail();
  // The same command line (memmap=, trace_instance=) into the other build.
  ASSERT_TRUE(console.Send("hvtrace-kexec-self\n").ok());
  auto ready = console.WaitForLine("HVTRACE-GUEST-READY " + other->release, kBootTimeout);
  ASSERT_TRUE(ready.ok()) << ready.error().message << "\n" << tail();
  if (reset) {
    auto cleared =
        console.Run("echo > /sys/kernel/tracing/instances/boot_map/trace", kCommandTimeout);
    ASSERT_TRUE(cleared.ok() && cleared->status == 0) << tail();
  }
  ASSERT_TRUE(WriteMarkers(console, "second-mark", 6, second_cpu).ok()) << tail();
  ASSERT_TRUE(
      console
          .Send(std::string("echo second-last > ") + kMarker + "; echo c > /proc/sysrq-trigger\n")
          .ok());
  auto panic = daemon.WaitForCapture(name, "panic", 90s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << "\n" << tail();
  const fs::path dir = fs::path(daemon.captures_dir(name)) / (*panic)["id"].get<std::string>();
  const json m = json::parse(test_support::ReadText((dir / "manifest.json").string()));
  const json& formats = m["extra"]["formats"];
  const json& boots = m["extra"]["boots"];
  std::printf("[kexec-other] range after kexec %s -> %s%s: layout %s, %s boot(s) in the range\n",
              image->release.c_str(), other->release.c_str(), reset ? " and a reset" : "",
              m["validation"].value("layout", json()).dump().c_str(),
              m["validation"].value("boots", json()).dump().c_str());
  ASSERT_EQ(formats["decoded"], true) << m["extra"].dump(2);
  EXPECT_EQ(formats["unknown_id_events"], 0) << formats.dump(2);
  ASSERT_TRUE(boots.is_array() && !boots.empty()) << m["extra"].dump(2);
  // The newest boot is the other build's; an older one, if the new kernel
  // appended, the first kernel's. Each identified by its banner, checked
  // against its records.
  const size_t n = boots.size();
  // Appended: both boots; reset: the new one alone, which pairs with the
  // last banner although the console has two.
  EXPECT_EQ(n, reset ? 1u : 2u) << boots.dump(2);
  for (size_t b = 0; b < n; ++b) {
    const json& with = boots[b]["decoded_with"];
    ASSERT_TRUE(with.is_object()) << boots.dump(2);
    std::printf("[kexec-other] boot %zu: %s events, decoded with %s\n", b,
                boots[b]["events"].dump().c_str(), with.dump().c_str());
    EXPECT_EQ(with.value("from", ""), "formats cache, identified by console banner")
        << with.dump(2);
    const std::string want = b + 1 == n ? other->release : image->release;
    EXPECT_EQ(with.value("release", ""), want) << with.dump(2);
    EXPECT_EQ(with["identified"]["check"]["passed"], true) << with.dump(2);
    EXPECT_EQ(with["identified"]["check"]["records"], boots[b]["events"]) << with.dump(2);
    EXPECT_NE(with["identified"].value("banner", "").find(want), std::string::npos);
  }
  std::printf("[kexec-other] events across boots: %s\n",
              formats["events_across_boots"].dump().c_str());
  std::printf("[kexec-other] identification: %s; panic->decoded %.1f ms\n",
              formats["identify"].dump().c_str(),
              m["extra"]["timing_ms"].value("trigger_to_decoded", -1.0));
  if (n >= 2) {
    const json& cmp = formats["events_across_boots"]["boots"][n - 2];
    EXPECT_FALSE(cmp.value("same_formats", false)) << cmp.dump(2);
    EXPECT_EQ(cmp["counts"]["moved"], moved) << cmp.dump(2);
    EXPECT_EQ(cmp["counts"]["changed"], changed) << cmp.dump(2);
  }
  // Every marker of every boot in the range decodes, by name.
  for (size_t b = 0; b < n; ++b) {
    const std::string report = BootReport(dir, b);
    const bool newest = b + 1 == n;
    const std::string prefix = newest ? "second-mark-" : "first-mark-";
    EXPECT_EQ(Count(report, prefix), 6u) << report.substr(0, 4000);
    if (reset) {
      EXPECT_EQ(Count(report, "first-mark-"), 0u);
    }
    EXPECT_EQ(Count(report, "[UNKNOWN"), 0u);
    EXPECT_GT(Count(report, "sched_switch:"), 0u);
    if (newest) {
      EXPECT_EQ(Count(report, "second-last"), 1u);
    }
    std::printf("[kexec-other] boot %zu trace.dat: %zu %s markers, %zu sched_switch\n", b,
                Count(report, prefix), prefix.c_str(), Count(report, "sched_switch:"));
  }
  EXPECT_TRUE(daemon.Call("stop", {{"name", name}}).ok());
}

// Attach mode (ivshmem + agent): the agent of each boot writes its own
// generation's format table; each generation decodes with it, and
// events_across_generations compares the tables by fingerprint. The events
// asked for include hwmon:hwmon_attr_show, whose layout differs between the
// builds (long -> long long): the table must say "changed" for it, which
// proves each generation's table is its own kernel's.
TEST(KexecOtherBuildE2e, AttachEachGenerationDecodesWithItsOwnTable) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "hvtrace-agent not built";
  }
  auto images = AgentImagesWithOtherBuild();
  ASSERT_TRUE(images.ok()) << images.error().message;
  GuestImage image = images->first;
  const OtherBuild& other = images->second;
  image.initrd = other.initrd;  // Boots 6.12.95, carries 6.12.117 for kexec.
  const std::string tag = "kxo-attach";
  TestGuest guest(tag);
  hostd::VmConfig config = guest.MakeConfig(image);
  const std::string daemon_qmp = AddDaemonMonitor(config, tag);
  ASSERT_TRUE(guest.Boot(config).ok()) << guest.Diagnostics();
  ASSERT_TRUE(guest.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)").ok());
  HvtracedProcess hvt({.tag = tag});
  ASSERT_TRUE(hvt.Start().ok()) << hvt.log();
  const std::string name = tag + "-" + std::to_string(::getpid());
  struct Cleanup {
    std::string path;
    ~Cleanup() { std::filesystem::remove(path); }
  } cleanup{hvt.dir() + "/run/mem/hvtrace-" + name + "-attach"};
  auto diag = [&] {
    auto agent = guest.Run("cat /tmp/agent.log");
    return guest.Diagnostics() + "\n--- agent ---\n" + (agent.ok() ? agent->output : "?") +
           "\n--- hvtraced ---\n" + hvt.LogTail();
  };
  auto attached = hvt.HvtraceJson(
      {"attach", name, "--qmp", daemon_qmp, "--size", "16M", "--pump-ms", "50", "--events",
       "sched:sched_switch,hwmon:hwmon_attr_show", "--wait-ms", "60000"});
  ASSERT_TRUE(attached.ok()) << attached.error().message << diag();
  ASSERT_EQ((*attached)["guest"]["boot_generation"], 1) << attached->dump(2);
  EXPECT_EQ((*attached)["guest"]["kernel_release"], image.release);
  const std::string marker = "/sys/kernel/tracing/instances/hvtrace/trace_marker";
  auto marks = [&](const std::string& prefix) {
    return guest.Run("for i in 1 2 3 4 5; do echo " + prefix + "-$i > " + marker +
                     "; ls /proc > /dev/null; done; sleep 1");
  };
  ASSERT_TRUE(marks("g1-mark").ok()) << diag();
  ASSERT_TRUE(guest.console().Send("hvtrace-kexec-self\n").ok());
  ASSERT_TRUE(
      guest.console().WaitForLine("HVTRACE-GUEST-READY " + other.release, kBootTimeout).ok())
      << diag();
  ASSERT_TRUE(guest.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)").ok());
  // The new boot's agent takes the region over as generation 2.
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto r = guest.Run("grep -q 'generation 2' /tmp/agent.log");
        return r.ok() && r->status == 0;
      },
      60s))
      << diag();
  ASSERT_TRUE(marks("g2-mark").ok()) << diag();
  ASSERT_TRUE(guest.console().Send("echo c > /proc/sysrq-trigger\n").ok());
  auto panic = hvt.WaitForCapture(name, "panic", 90s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << diag();
  const fs::path dir = fs::path(hvt.captures_dir(name)) / (*panic)["id"].get<std::string>();
  const json m = json::parse(test_support::ReadText((dir / "manifest.json").string()));
  const json& attach = m["extra"]["attach"];
  std::printf("[kexec-other attach] generations: %s\n", attach["generations"].dump().c_str());
  std::printf("[kexec-other attach] events across generations: %s\n",
              attach["events_across_generations"].dump().c_str());
  const json& across = attach["events_across_generations"];
  ASSERT_EQ(across["tables"], json::array({1, 2})) << across.dump(2);
  ASSERT_EQ(across["generations"].size(), 1u) << across.dump(2);
  const json& cmp = across["generations"][0];
  EXPECT_EQ(cmp["generation"], 2);
  EXPECT_EQ(cmp["compared_with"], 1);
  EXPECT_EQ(cmp["counts"]["changed"], 1) << cmp.dump(2);
  EXPECT_EQ(cmp["changed"][0]["event"], "hwmon/hwmon_attr_show") << cmp.dump(2);
  EXPECT_EQ(cmp["counts"]["moved"], 0) << cmp.dump(2);
  EXPECT_GE(cmp["counts"]["kept"].get<int>(), 2) << cmp.dump(2);  // print, sched_switch
  for (const json& g : attach["generations"]) EXPECT_EQ(g["unknown_id"], 0) << g.dump();
  for (int gen : {1, 2}) {
    const std::string report = test_support::RunCommand(
        "trace-cmd report '" +
        (dir / ("region-gen-" + std::to_string(gen) + ".trace.dat")).string() + "' 2>&1");
    const std::string mine = "g" + std::to_string(gen) + "-mark-";
    const std::string theirs = "g" + std::to_string(3 - gen) + "-mark-";
    EXPECT_EQ(Count(report, mine), 5u) << report.substr(0, 3000);
    EXPECT_EQ(Count(report, theirs), 0u);
    EXPECT_GT(Count(report, "sched_switch:"), 0u);
    EXPECT_EQ(Count(report, "[UNKNOWN"), 0u);
    std::printf("[kexec-other attach] generation %d: %zu markers, %zu sched_switch\n", gen,
                Count(report, mine), Count(report, "sched_switch:"));
  }
}

// The capture |dir| (its manifest) holds one boot, of |layout|, decoded with
// |release|'s formats, in which all |count| markers |prefix|-N print by name
// and no event is unknown; |absent| marks none. Prints what it saw as |what|.
void ExpectOneBootWithItsMarkers(const fs::path& dir, const std::string& what,
                                 const std::string& layout, const std::string& release,
                                 const std::string& prefix, size_t count,
                                 const std::string& absent) {
  const json m = json::parse(test_support::ReadText((dir / "manifest.json").string()));
  const json& boots = m["extra"]["boots"];
  const std::string found_layout = m["validation"].value("layout", "");
  ASSERT_TRUE(boots.is_array() && boots.size() == 1u) << m["validation"].dump(2);
  const json& with = boots[0]["decoded_with"];
  const std::string report = BootReport(dir, 0);
  std::printf(
      "[kexec-layout] %s: trigger %s, layout %s, %s events, decoded with %s (%s), "
      "%zu of %zu %s markers by name, %zu %s, %zu unknown\n",
      what.c_str(), m.value("trigger", "").c_str(), found_layout.c_str(),
      boots[0]["events"].dump().c_str(), with.value("from", "").c_str(),
      with.value("release", "").c_str(), Count(report, prefix + "-"), count, prefix.c_str(),
      Count(report, absent + "-"), absent.c_str(), Count(report, "[UNKNOWN"));
  EXPECT_EQ(m["extra"]["formats"]["decoded"], true) << m["extra"]["formats"].dump(2);
  EXPECT_TRUE(found_layout.starts_with(layout)) << found_layout;
  EXPECT_EQ(with.value("release", ""), release) << with.dump(2);
  EXPECT_EQ(Count(report, prefix + "-"), count) << report.substr(0, 4000);
  EXPECT_EQ(Count(report, absent + "-"), 0u);
  EXPECT_EQ(Count(report, "[UNKNOWN"), 0u);
  EXPECT_GT(Count(report, "sched_switch:"), 0u);
}

// kexec from 6.12 into 7.3, a kernel of another persistent-buffer layout:
// 7.3 does not recognise 6.12's meta and initialises the range afresh. The
// 6.12 boot's agent, stopped (SIGTERM, as init or systemd does before a
// kexec), tells hvtraced over the metadata channel; hvtraced copies the range
// ("guest-leaving") and acks before the agent exits. So the old boot survives
// in its own capture, decoded with 6.12's formats, and the panic capture holds
// the 7.3 boot, decoded with 7.3's.
TEST(KexecOtherLayoutE2e, TheAgentsLeavingNoticeKeepsTheOldBootTheNewKernelWipes) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "hvtrace-agent not built";
  }
  auto images = AgentImagesWithOtherBuild("guest-layout", "7.3");
  ASSERT_TRUE(images.ok()) << images.error().message;
  const GuestImage& image = images->first;
  const OtherBuild& other = images->second;
  ASSERT_TRUE(other.release.starts_with("7.")) << other.release;
  // 7.3's formats in the daemon's cache: its boot has no agent.
  for (const auto& [vmlinuz, initrd] :
       {std::pair{image.kernel, image.initrd}, std::pair{other.kernel, other.initrd}}) {
    Result<std::string> h = Harvest(vmlinuz, initrd);
    ASSERT_TRUE(h.ok()) << h.error().message;
  }
  HvtracedProcess daemon({.tag = "kxlayout", .config = "vm_on_shutdown = stop\n"});
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  const std::string name = "kx-layout-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(daemon, name, image.kernel, other.initrd);
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  hostd::GuestConsole& console = *guest->console;
  auto tail = [&] { return ConsoleAndLog(*guest, daemon); };
  ASSERT_TRUE(console.WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();
  ASSERT_TRUE(console.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)", kCommandTimeout).ok());
  // An agent that has run a while: its boot's metadata is at the host.
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto status = daemon.Call("status", {{"name", name}});
        return status.ok() && (*status)["meta"].value("boots_accepted", 0) >= 1;
      },
      120s))
      << tail();
  ASSERT_TRUE(WriteMarkers(console, "old-mark", 6).ok()) << tail();

  // What init (busybox) or systemd does before the kexec: stop the agent.
  auto stopped = console.Run(
      "kill -TERM $(pidof hvtrace-agent); while pidof hvtrace-agent > /dev/null; do usleep 20000; "
      "done; grep leaving /tmp/agent.log",
      kCommandTimeout);
  ASSERT_TRUE(stopped.ok()) << tail();
  std::printf("[kexec-layout] agent: %s", stopped->output.c_str());
  std::smatch ack;
  ASSERT_TRUE(
      std::regex_search(stopped->output, ack,
                        std::regex(R"(acknowledged \(copied\) after (\d+) ms \(host: (\d+) ms\))")))
      << stopped->output << tail();
  auto leaving = daemon.WaitForCapture(name, "guest-leaving", 60s);
  ASSERT_TRUE(leaving.ok()) << leaving.error().message << tail();
  const fs::path leaving_dir =
      fs::path(daemon.captures_dir(name)) / (*leaving)["id"].get<std::string>();
  const json lm = json::parse(test_support::ReadText((leaving_dir / "manifest.json").string()));
  std::printf(
      "[kexec-layout] ack latency: agent %s ms (notice sent -> ack read), host %s ms "
      "(notice -> copy durable); capture trigger->recoverable %.1f ms, ->decoded %.1f ms\n",
      ack[1].str().c_str(), ack[2].str().c_str(),
      lm["extra"]["timing_ms"].value("trigger_to_recoverable", -1.0),
      lm["extra"]["timing_ms"].value("trigger_to_decoded", -1.0));
  EXPECT_LT(std::stoi(ack[1]), 2000);

  ASSERT_TRUE(console.Send("hvtrace-kexec-self\n").ok());
  auto ready = console.WaitForLine("HVTRACE-GUEST-READY " + other.release, kBootTimeout);
  ASSERT_TRUE(ready.ok()) << ready.error().message << "\n" << tail();
  ASSERT_TRUE(WriteMarkers(console, "new-mark", 6).ok()) << tail();
  ASSERT_TRUE(
      console.Send(std::string("echo new-mark-7 > ") + kMarker + "; echo c > /proc/sysrq-trigger\n")
          .ok());
  auto panic = daemon.WaitForCapture(name, "panic", 90s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << "\n" << tail();
  const fs::path panic_dir =
      fs::path(daemon.captures_dir(name)) / (*panic)["id"].get<std::string>();

  ExpectOneBootWithItsMarkers(leaving_dir, "pre-kexec capture", "linux-6.12", image.release,
                              "old-mark", 6, "new-mark");
  ExpectOneBootWithItsMarkers(panic_dir, "panic capture", "linux-6.15", other.release, "new-mark",
                              7, "old-mark");
  EXPECT_TRUE(daemon.Call("stop", {{"name", name}}).ok());
}

// 6.12.95 -> 6.12.117 appending and reset; 7.3.4 -> 7.2.12 (the 6.15+
// layout, other event ids) appending.
INSTANTIATE_TEST_SUITE_P(
    Range, KexecOtherBuildRangeE2e,
    ::testing::Values(RangeCase{"6.12", false}, RangeCase{"6.12", true}, RangeCase{"7.3", false}),
    [](const ::testing::TestParamInfo<RangeCase>& param) {
      std::string name = param.param.kernel == std::string("6.12") ? "Linux6_12" : "Linux7_3";
      return name + (param.param.reset ? "NewBootResetsTheRange" : "NewBootAppends");
    });

}  // namespace
}  // namespace hvtrace::e2e
