// Module events across a kexec, in another load order, with a real 6.12
// guest under TCG: hvtraced boots it with its boot range and the metadata
// channel; the agent runs in the guest. Two test modules with trace events
// of different layouts (tests/guest/modules: hvt_alpha, hvt_beta, built
// against the guest kernel's headers by build-guest.sh --with-test-modules)
// are loaded after the agent sent its boot archive, alpha then beta; the
// agent notices the new events and sends a newer archive. A kexec into the
// same kernel, beta then alpha (the kernel hands out the same ids the other
// way round), a panic. Every module event of both boots must decode, from
// the capture alone, to its own name and field values (sequence numbers the
// modules derive every field from), and the ids must differ between boots:
// the guest kernel's own `trace` file prints the first boot's events under
// the second boot's names (seen while writing this test), the capture must
// not.
//
// The second boot enables the events from the kernel side (the modules'
// instance= parameter): on 6.12 a write to a tracefs "enable" file resets a
// persistent buffer that holds an earlier boot, which would leave one boot.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "test_support.h"
#include "vm_console.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using test_support::ReadText;

constexpr char kInstance[] = "/sys/kernel/tracing/instances/boot_map";

// Polls the VM's metadata-channel status until |done| holds (300 s).
template <typename Done>
json WaitForMeta(HvtracedProcess& daemon, const std::string& name, Done done) {
  json meta;
  const auto deadline = std::chrono::steady_clock::now() + 300s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto status = daemon.Call("status", {{"name", name}});
    if (!status.ok()) return json{{"error", status.error().message}};
    meta = (*status)["meta"];
    if (meta.is_object() && done(meta)) break;
    std::this_thread::sleep_for(500ms);
  }
  return meta;
}

uint64_t Count(const json& meta, const char* key) { return meta.value(key, uint64_t{0}); }

// The guest's ids of the four module events, "system/event" -> id.
std::map<std::string, int> GuestIds(hostd::GuestConsole& console) {
  std::map<std::string, int> ids;
  for (const char* e : {"hvt_alpha/alpha_seq", "hvt_alpha/alpha_pair", "hvt_beta/beta_named",
                        "hvt_beta/beta_flag"}) {
    auto r =
        console.Run(std::string("cat /sys/kernel/tracing/events/") + e + "/id", kCommandTimeout);
    ids[e] = r.ok() ? std::atoi(r->output.c_str()) : -1;
  }
  return ids;
}

// The events of one boot as `hvtrace show --json --boot N` prints them.
std::vector<json> ShowJson(const fs::path& dir, unsigned boot, std::string* out) {
  const std::string hvtrace = std::string(HVTRACE_BIN_DIR) + "/hvtrace";
  test_support::CommandResult r = test_support::RunCommandStatus(
      hvtrace + " show --json --boot " + std::to_string(boot) + " '" + dir.string() + "'");
  *out = r.out;
  std::vector<json> events;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("ts_ns")) events.push_back(std::move(j));
  }
  return events;
}

// Checks that |events| hold exactly |n| pairs of each module's events with
// the values the modules derive from sequence numbers |base|..|base|+n-1.
void ExpectModuleEvents(const std::vector<json>& events, uint32_t base, uint32_t n) {
  std::map<std::string, std::multiset<std::string>> got;
  for (const json& e : events) {
    if (!e["event"].is_string()) continue;
    const std::string sys = e.value("system", std::string());
    if (sys != "hvt_alpha" && sys != "hvt_beta") continue;
    got[e["event"].get<std::string>()].insert(e["fields"].dump());
  }
  std::map<std::string, std::multiset<std::string>> want;
  for (uint32_t seq = base; seq < base + n; ++seq) {
    char tag[16];
    std::snprintf(tag, sizeof tag, "al%05u", seq % 100000);
    want["alpha_seq"].insert(json{{"seq", seq}, {"tag", tag}}.dump());
    want["alpha_pair"].insert(
        json{{"a", uint64_t{seq} * 0x100000001ull}, {"b", -static_cast<int>(seq % 30000)}}.dump());
    want["beta_named"].insert(json{
        {"x", (uint64_t{seq} << 33) | seq}, {"y", seq * 7}, {"name", "beta-" + std::to_string(seq)}}
                                  .dump());
    want["beta_flag"].insert(json{{"flag", seq & 0xff}}.dump());
  }
  for (const auto& [event, values] : want) {
    EXPECT_EQ(got[event], values) << event;
  }
  EXPECT_EQ(got.size(), want.size()) << "module events of other names decoded";
}

TEST(ModuleEventsE2e, ModulesLoadedInAnotherOrderAfterKexecDecodeWithEachBootsOwnIds) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "hvtrace-agent not built";
  }
  Result<GuestImage> image = GuestImageWithTestModules("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  char cache_tmpl[] = "/tmp/hvt-modev-cache-XXXXXX";
  ASSERT_NE(::mkdtemp(cache_tmpl), nullptr);
  struct RemoveCache {
    fs::path dir;
    ~RemoveCache() { fs::remove_all(dir); }
  } remove_cache{cache_tmpl};
  // No formats cache and nothing to harvest with: only the channel decodes.
  HvtracedProcess daemon({.tag = "modev",
                          .config = "vm_on_shutdown = stop\nharvest_initrd = "
                                    "/nonexistent/hvtrace-no-harvest.img\ncache_dir = " +
                                    std::string(cache_tmpl) + "\n"});
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  const std::string name = "modev-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(daemon, name, image->kernel, image->initrd);
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  hostd::GuestConsole& console = *guest->console;
  auto tail = [&] { return ConsoleAndLog(*guest, daemon); };

  // Boot 0: alpha then beta, 5 pairs each from sequence 100, enabled with
  // the tracefs files. Boot 1: beta then alpha, 4 pairs each from 200.
  const uint32_t base[2] = {100, 200}, count[2] = {5, 4};
  std::vector<std::map<std::string, int>> ids;
  std::vector<std::string> boot_ids;
  for (int boot = 0; boot < 2; ++boot) {
    SCOPED_TRACE("boot " + std::to_string(boot));
    ASSERT_TRUE(console.WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();
    ASSERT_TRUE(console.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)", kCommandTimeout).ok());
    json meta = WaitForMeta(daemon, name, [&](const json& m) {
      return Count(m, "boots_accepted") >= uint64_t(boot + 1) && Count(m, "comms_updates") >= 1;
    });
    ASSERT_EQ(Count(meta, "boots_accepted"), uint64_t(boot + 1)) << meta.dump(2) << tail();
    boot_ids.push_back(meta["last_boot"]["boot_id"]);
    const uint64_t updated_before = Count(meta, "boots_updated");

    const std::string mods = "/lib/modules/$(uname -r)/hvtrace-test/";
    const std::string args = " base=" + std::to_string(base[boot]) +
                             (boot == 0 ? std::string() : std::string(" instance=boot_map"));
    const std::string first = boot == 0 ? "hvt_alpha" : "hvt_beta";
    const std::string second = boot == 0 ? "hvt_beta" : "hvt_alpha";
    for (const std::string& m : {first, second}) {
      auto r = console.Run("insmod " + mods + m + ".ko" + args, kCommandTimeout);
      ASSERT_TRUE(r.ok() && r->status == 0) << (r.ok() ? r->output : r.error().message) << tail();
    }
    if (boot == 0) {
      ASSERT_TRUE(console
                      .Run(std::string("echo 1 > ") + kInstance + "/events/hvt_alpha/enable && " +
                               "echo 1 > " + kInstance + "/events/hvt_beta/enable",
                           kCommandTimeout)
                      .ok());
    }
    ids.push_back(GuestIds(console));
    for (const std::string& m : {first, second}) {
      auto r = console.Run(
          "echo " + std::to_string(count[boot]) + " > /sys/module/" + m + "/parameters/emit",
          kCommandTimeout);
      ASSERT_TRUE(r.ok() && r->status == 0) << tail();
    }
    // The agent saw the modules come and sent a newer archive for this boot.
    meta = WaitForMeta(daemon, name,
                       [&](const json& m) { return Count(m, "boots_updated") > updated_before; });
    auto agent_log = console.Run("cat /tmp/agent.log", kCommandTimeout);
    ASSERT_GT(Count(meta, "boots_updated"), updated_before)
        << meta.dump(2) << "\n--- agent ---\n"
        << (agent_log.ok() ? agent_log->output : "") << tail();
    EXPECT_EQ(meta["last_boot"]["boot_id"], boot_ids.back());
    EXPECT_EQ(Count(meta, "boots_refused"), 0u) << meta.dump(2);
    std::printf(
        "[modev e2e] boot %d (%s): ids alpha_seq %d alpha_pair %d beta_named %d "
        "beta_flag %d; channel %s\n",
        boot, boot_ids.back().c_str(), ids.back()["hvt_alpha/alpha_seq"],
        ids.back()["hvt_alpha/alpha_pair"], ids.back()["hvt_beta/beta_named"],
        ids.back()["hvt_beta/beta_flag"], meta.dump().c_str());
    ASSERT_TRUE(
        console.Send(boot == 0 ? "hvtrace-kexec-self\n" : "echo c > /proc/sysrq-trigger\n").ok());
  }
  // The load order moved the ids: each event has another id in each boot.
  for (const auto& [event, id] : ids[0]) EXPECT_NE(id, ids[1][event]) << event;

  auto panic = daemon.WaitForCapture(name, "panic", 90s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << tail();
  const fs::path dir =
      fs::path(daemon.vm_dir(name)) / "captures" / (*panic)["id"].get<std::string>();
  json m = json::parse(ReadText(dir / "manifest.json"));
  ASSERT_EQ(m["extra"]["formats"]["decoded"], true) << m["extra"].dump(2);
  const json& boots = m["extra"]["boots"];
  ASSERT_EQ(boots.size(), 2u) << m["validation"].dump(2);
  for (unsigned boot = 0; boot < 2; ++boot) {
    SCOPED_TRACE("boot " + std::to_string(boot));
    const json& with = boots[boot]["decoded_with"];
    std::printf("[modev e2e] capture boot %u decoded_with: %s\n", boot, with.dump().c_str());
    EXPECT_EQ(with["from"], "meta channel") << with.dump(2);
    EXPECT_EQ(with["boot_id"], boot_ids[boot]) << with.dump(2);
    // The newer archive decoded the boot: its bundle says what came later.
    ASSERT_TRUE(with.contains("bundle")) << with.dump(2);
    EXPECT_GE(with["bundle"]["revision"].get<int>(), 2);
    const json& added = with["bundle"]["changes"]["added"];
    for (const char* e : {"hvt_alpha/alpha_seq", "hvt_beta/beta_named"}) {
      EXPECT_NE(std::find(added.begin(), added.end(), e), added.end()) << with.dump(2);
    }
    std::string out;
    const std::vector<json> events = ShowJson(dir, boot, &out);
    size_t unknown = 0;
    for (const json& e : events) unknown += e["event"].is_null() ? 1 : 0;
    std::printf("[modev e2e] show --json boot %u: %zu events, %zu with an unknown id\n", boot,
                events.size(), unknown);
    ASSERT_FALSE(events.empty()) << out.substr(0, 2000);
    ExpectModuleEvents(events, base[boot], count[boot]);
    // No event of the modules' id range went undecoded.
    for (const json& e : events) {
      if (!e["event"].is_null()) continue;
      const int id = e.value("id", -1);
      for (const auto& [event, module_id] : ids[boot]) {
        EXPECT_NE(id, module_id) << "an event with " << event << "'s id printed raw";
      }
    }
  }
}

}  // namespace
}  // namespace hvtrace::e2e
