// kexec from one kernel build into another (Debian's 6.12.95 from
// bookworm-backports into 6.12.117 from bookworm-security), boot range, no
// agent: each boot of the capture decodes with its own kernel's formats,
// identified by the console banner and checked against the records
// (hostd/capture/boot_kernels.h), and the manifest's id table says what
// moved or changed between the builds (event_id_table.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

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

// build-guest.sh --with-kexec-other: the other 6.12 build and the initramfs
// that carries it at /boot/vmlinuz (cached after the first run).
Result<OtherBuild> FindOtherBuild() {
  const std::string cmd = std::string(HVTRACE_SOURCE_DIR) +
                          "/qemu-scripts/build-guest.sh --kernel 6.12 --with-kexec-other 2>&1";
  const std::string out = test_support::RunCommand(cmd);
  static const std::regex kLine(R"(OTHER 6\.12 KERNEL=(\S+) INITRD=(\S+) RELEASE=(\S+))");
  std::smatch m;
  if (!std::regex_search(out, m, kLine))
    return Error{"`" + cmd + "` printed no OTHER line:\n" + out};
  return OtherBuild{m[1], m[2], m[3]};
}

// `hvtrace formats harvest`, as a user runs it for a kernel their VM may
// kexec into; prints the key.
Result<std::string> Harvest(const std::string& kernel, const std::string& initrd) {
  test_support::CommandResult r = test_support::RunCommandStatus(
      std::string(HVTRACE_BIN_DIR) + "/hvtrace formats harvest --kernel '" + kernel +
      "' --initrd '" + initrd + "' 2>&1");
  if (r.status != 0) return Error{"harvest of " + kernel + " failed:\n" + r.out};
  return r.out;
}

Status WriteMarkers(hostd::GuestConsole& console, const std::string& prefix, int count) {
  const std::string cmd = "for i in $(seq 1 " + std::to_string(count) + "); do echo " + prefix +
                          "-$i > " + kMarker + "; ls /proc > /dev/null; sleep 0.1; done";
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

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(KexecOtherBuildE2e, EachBootDecodesWithItsOwnKernelsFormats) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  Result<OtherBuild> other = FindOtherBuild();
  ASSERT_TRUE(other.ok()) << other.error().message;
  ASSERT_NE(other->release, image->release);
  // Both kernels' formats in the cache the daemon reads (the default one).
  std::vector<std::string> entries;
  for (const auto& [kernel, initrd] :
       {std::pair{image->kernel, image->initrd}, std::pair{other->kernel, other->initrd}}) {
    Result<std::string> h = Harvest(kernel, initrd);
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
  auto booted = daemon.Call("boot", {{"name", name},
                                     {"kernel", image->kernel},
                                     {"initrd", other->initrd},
                                     {"accel", "tcg"},
                                     {"trace_size_mib", 16}});
  ASSERT_TRUE(booted.ok()) << booted.error().message << "\n" << daemon.log();
  auto console = hostd::GuestConsole::Connect((*booted)["console_socket"], 10s);
  ASSERT_TRUE(console.ok()) << console.error().message;
  auto tail = [&] { return (*console)->Tail(40) + "\n--- hvtraced ---\n" + daemon.log(); };
  ASSERT_TRUE((*console)->WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();
  ASSERT_TRUE(WriteMarkers(**console, "b95-mark", 6).ok()) << tail();
  // The same command line (memmap=, trace_instance=) into the other build.
  ASSERT_TRUE((*console)->Send("hvtrace-kexec-self\n").ok());
  auto ready = (*console)->WaitForLine("HVTRACE-GUEST-READY " + other->release, kBootTimeout);
  ASSERT_TRUE(ready.ok()) << ready.error().message << "\n" << tail();
  ASSERT_TRUE(WriteMarkers(**console, "b117-mark", 6).ok()) << tail();
  ASSERT_TRUE(
      (*console)
          ->Send(std::string("echo b117-last > ") + kMarker + "; echo c > /proc/sysrq-trigger\n")
          .ok());
  auto panic = daemon.WaitForCapture(name, "panic", 90s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << "\n" << tail();
  const fs::path dir = fs::path(daemon.captures_dir(name)) / (*panic)["id"].get<std::string>();
  const json m = json::parse(test_support::ReadText((dir / "manifest.json").string()));
  const json& formats = m["extra"]["formats"];
  const json& boots = m["extra"]["boots"];
  std::printf("[kexec-other] range after kexec %s -> %s: layout %s, %s boot(s) in the range\n",
              image->release.c_str(), other->release.c_str(),
              m["validation"].value("layout", json()).dump().c_str(),
              m["validation"].value("boots", json()).dump().c_str());
  ASSERT_EQ(formats["decoded"], true) << m["extra"].dump(2);
  EXPECT_EQ(formats["unknown_id_events"], 0) << formats.dump(2);
  ASSERT_TRUE(boots.is_array() && !boots.empty()) << m["extra"].dump(2);
  // The newest boot is 6.12.117's; an older one, if the new kernel appended,
  // 6.12.95's. Each identified by its banner, checked against its records.
  const size_t n = boots.size();
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
  if (n >= 2) {
    const json& cmp = formats["events_across_boots"]["boots"][n - 2];
    EXPECT_FALSE(cmp.value("same_formats", false)) << cmp.dump(2);
    EXPECT_EQ(cmp["counts"]["moved"], moved) << cmp.dump(2);
    EXPECT_EQ(cmp["counts"]["changed"], changed) << cmp.dump(2);
  }
  // Every marker of every boot in the range decodes, by name.
  for (size_t b = 0; b < n; ++b) {
    const std::string report = test_support::RunCommand(
        "trace-cmd report '" + (dir / ("boot-" + std::to_string(b) + ".trace.dat")).string() +
        "' 2>&1");
    const bool newest = b + 1 == n;
    const std::string prefix = newest ? "b117-mark-" : "b95-mark-";
    EXPECT_EQ(Count(report, prefix), 6u) << report.substr(0, 4000);
    EXPECT_EQ(Count(report, "[UNKNOWN"), 0u);
    EXPECT_GT(Count(report, "sched_switch:"), 0u);
    if (newest) {
      EXPECT_EQ(Count(report, "b117-last"), 1u);
    }
    std::printf("[kexec-other] boot %zu trace.dat: %zu %s markers, %zu sched_switch\n", b,
                Count(report, prefix), prefix.c_str(), Count(report, "sched_switch:"));
  }
  EXPECT_TRUE(daemon.Call("stop", {{"name", name}}).ok());
}

}  // namespace
}  // namespace hvtrace::e2e
