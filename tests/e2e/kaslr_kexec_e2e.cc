// Per-boot KASLR offsets after a kexec, with a real 6.12 guest under TCG
// booted by a private hvtraced, the kernel's formats (kallsyms included)
// harvested by a separate boot at its own KASLR offset:
//   - kexec WITHOUT reset: the new kernel appends to the persistent buffer;
//     the meta's text_addr stays the first boot's;
//   - kexec WITH reset: the new boot enables an event through tracefs
//     (tracing_update_buffers -> update_last_data wipes the last boot's data
//     when its text delta is not 0); the old boot is gone, text_addr is the
//     wiped boot's.
// In every boot the guest writes trace_marker lines and prints its own
// addresses of a few symbols (/proc/kallsyms): the independent truth. After
// the panic, each boot's decoded_with.kaslr delta must be that boot's
// _text - the harvest's _text, every marker line must name
// tracing_mark_write, and every hrtimer/timer callback name `hvtrace show`
// prints must be a function start at exactly the raw value (`--json`).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "formats_cache.h"
#include "formats_harvest.h"
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

constexpr const char* kInstance = "/sys/kernel/tracing/instances/boot_map";
constexpr int kMarkers = 5;
// Symbols whose addresses the guest prints in each boot (the truth).
constexpr const char* kTruthSymbols =
    "_text|tracing_mark_write|tick_nohz_handler|hrtimer_wakeup|process_timeout|"
    "delayed_work_timer_fn|it_real_fn|watchdog_timer_fn";

using Symbols = std::map<std::string, uint64_t>;

// "ffffffff81000000 T _text" lines (core symbols only: module lines end in
// "\t[mod]") -> name -> address.
Symbols ParseKallsyms(const std::string& text) {
  Symbols out;
  static const std::regex line(R"(^([0-9a-f]{16}) [A-Za-z] (\S+)$)");
  for (const std::string& l : TextLines(text)) {
    std::smatch m;
    if (std::regex_match(l, m, line)) out.emplace(m[2], std::stoull(m[1], nullptr, 16));
  }
  return out;
}

struct BootTruth {
  Symbols symbols;    // The guest's own addresses in this boot.
  int64_t delta = 0;  // Its _text - the harvest's _text.
};

Result<BootTruth> ReadTruth(hostd::GuestConsole& console, const Symbols& harvest) {
  auto ran = console.Run(std::string("grep -E ' (") + kTruthSymbols + ")$' /proc/kallsyms",
                         kCommandTimeout);
  if (!ran.ok()) return ran.error();
  BootTruth t;
  t.symbols = ParseKallsyms(ran->output);
  if (!t.symbols.contains("_text") || !harvest.contains("_text")) {
    return Error{"no _text in the guest's kallsyms: " + ran->output};
  }
  t.delta = static_cast<int64_t>(t.symbols["_text"] - harvest.at("_text"));
  return t;
}

Status WriteMarkers(hostd::GuestConsole& console, const std::string& prefix) {
  const std::string cmd = "for i in $(seq 1 " + std::to_string(kMarkers) + "); do echo " + prefix +
                          "-$i > " + kInstance + "/trace_marker; sleep 0.2; done";
  auto ran = console.Run(cmd, kCommandTimeout);
  if (!ran.ok()) return ran.error();
  if (ran->status != 0) return Error{"marker loop exited " + std::to_string(ran->status)};
  return {};
}

// The printed name of a callback field ("function=NAME", "function=NAME/0x0",
// "function=0xffff..."): the name, or "" when printed raw.
std::string PrintedFunction(const std::string& line) {
  const size_t at = line.find("function=");
  if (at == std::string::npos) return "?";
  std::string name = line.substr(at + 9);
  name = name.substr(0, name.find_first_of(" /"));
  return name.starts_with("0x") ? std::string() : name;
}

// Checks boot |boot| of capture |dir| against the guest's |truth|.
void CheckBoot(const fs::path& dir, uint32_t boot, const std::string& prefix, int markers,
               const BootTruth& truth, const Symbols& harvest) {
  SCOPED_TRACE("capture boot " + std::to_string(boot));
  const std::string hvtrace = std::string(HVTRACE_BIN_DIR) + "/hvtrace";
  const std::string show = hvtrace + " show '" + dir.string() + "' --boot " + std::to_string(boot);
  test_support::CommandResult text = test_support::RunCommandStatus(show);
  test_support::CommandResult js = test_support::RunCommandStatus(show + " --json");
  ASSERT_EQ(text.status, 0);
  ASSERT_EQ(js.status, 0);
  int named_markers = 0, other_markers = 0;
  std::vector<std::string> callback_lines;
  for (const std::string& line : TextLines(text.out)) {
    // The crash summary's lines (its "last events" repeat some) are not events.
    if (line.starts_with("#")) continue;
    if (line.find(prefix + "-") != std::string::npos) {
      (line.find("tracing_mark_write: " + prefix + "-") != std::string::npos ? named_markers
                                                                             : other_markers)++;
      if (line.find("tracing_mark_write: ") == std::string::npos) ADD_FAILURE() << line;
    }
    if (line.find(" hrtimer_expire_entry:") != std::string::npos ||
        line.find(" timer_expire_entry:") != std::string::npos) {
      callback_lines.push_back(line);
    }
  }
  std::vector<uint64_t> raw;
  for (const std::string& line : TextLines(js.out)) {
    if (line.empty() || line[0] != '{') continue;
    json e = json::parse(line, nullptr, false);
    if (!e.is_object() || !e.contains("event")) continue;
    if (e["event"] == "hrtimer_expire_entry" || e["event"] == "timer_expire_entry") {
      raw.push_back(e["fields"].value("function", uint64_t{0}));
    }
  }
  EXPECT_EQ(named_markers, markers);
  EXPECT_EQ(other_markers, 0);
  ASSERT_EQ(raw.size(), callback_lines.size());
  // Every printed callback name is a function start at exactly the raw
  // value: the harvest's address of the name moved by the guest's own
  // delta, and the guest's own address where it printed one.
  std::map<std::string, size_t> names;
  size_t printed_raw = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    const std::string name = PrintedFunction(callback_lines[i]);
    if (name.empty()) {
      ++printed_raw;
      continue;
    }
    ++names[name];
    auto h = harvest.find(name);
    ASSERT_NE(h, harvest.end()) << callback_lines[i];
    EXPECT_EQ(h->second + static_cast<uint64_t>(truth.delta), raw[i]) << callback_lines[i];
    if (auto g = truth.symbols.find(name); g != truth.symbols.end()) {
      EXPECT_EQ(g->second, raw[i]) << callback_lines[i];
    }
  }
  std::string list;
  for (const auto& [n, c] : names) list += " " + n + "x" + std::to_string(c);
  std::printf(
      "[kaslr e2e] boot %u: %d markers named tracing_mark_write; %zu callbacks, %zu raw,"
      " by name:%s\n",
      boot, named_markers, raw.size(), printed_raw, list.c_str());
  EXPECT_FALSE(names.empty());
  EXPECT_EQ(printed_raw, 0u);
}

void RunKexec(bool reset) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  Result<std::string> kexec_initrd = FindKexecInitrd(*image);
  ASSERT_TRUE(kexec_initrd.ok()) << kexec_initrd.error().message;
  // The formats (and kallsyms) from a boot of their own: another KASLR offset.
  auto cache_root = hostd::DefaultCacheRoot();
  ASSERT_TRUE(cache_root.ok()) << cache_root.error().message;
  auto harvested = HarvestImage(*image, *cache_root);
  ASSERT_TRUE(harvested.ok()) << harvested.error().message;
  const Symbols harvest_syms =
      ParseKallsyms(test_support::ReadText((harvested->entry_dir / "kallsyms").string()));
  ASSERT_TRUE(harvest_syms.contains("_text") && harvest_syms.contains("rb_meta_init_text_addr"));

  const std::string tag = reset ? "kaslr-rst" : "kaslr-app";
  HvtracedProcess daemon(
      {.tag = tag, .config = "vm_on_shutdown = stop\ncache_dir = " + cache_root->string() + "\n"});
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  const std::string name = tag + "-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(daemon, name, image->kernel, *kexec_initrd);
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  hostd::GuestConsole& con = *guest->console;
  auto tail = [&] { return ConsoleAndLog(*guest, daemon); };
  ASSERT_TRUE(con.WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();

  // Every guest boot: its truth, then its markers. Kexec until the boot under
  // test sits at an offset unlike the harvest's and unlike boot 0's, or the
  // test proves nothing: KASLR picks one of ~490 2 MiB slots, so a
  // coincidence is ~0.2% per pair, and CI met one (boot 1 at the harvest's
  // offset). A boot 0 at the harvest's offset is kept (logged): the last
  // boot still differs from both.
  std::vector<BootTruth> truth;
  constexpr size_t kMaxKexecs = 4;
  for (size_t k = 0; k <= kMaxKexecs; ++k) {
    if (k > 0) {
      ASSERT_TRUE(con.Send("hvtrace-kexec-self\n").ok());
      ASSERT_TRUE(con.WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();
    }
    auto t = ReadTruth(con, harvest_syms);
    ASSERT_TRUE(t.ok()) << t.error().message << tail();
    truth.push_back(*t);
    std::printf("[kaslr e2e] %s: guest boot %zu _text %016llx (harvest %016llx): delta %lld\n",
                reset ? "reset" : "append", k, static_cast<unsigned long long>(t->symbols["_text"]),
                static_cast<unsigned long long>(harvest_syms.at("_text")),
                static_cast<long long>(t->delta));
    if (k > 0 && t->delta != 0 && t->delta != truth[0].delta) break;
    if (k > 0) std::printf("[kaslr e2e] guest boot %zu: offset coincides, kexec again\n", k);
    ASSERT_TRUE(WriteMarkers(con, "kaslr-b" + std::to_string(k)).ok()) << tail();
  }
  const size_t last = truth.size() - 1;
  ASSERT_GE(last, 1u);
  ASSERT_NE(truth[last].delta, 0) << "every kexec met a coincident KASLR offset";
  ASSERT_NE(truth[last].delta, truth[0].delta);
  if (reset) {
    // Enabling an event through tracefs wipes the last boot's data.
    auto ran = con.Run(std::string("echo 1 > ") + kInstance +
                           "/events/sched/sched_switch/enable; grep -c 'kaslr-b[0-9]-' " +
                           kInstance + "/trace",
                       kCommandTimeout);
    ASSERT_TRUE(ran.ok()) << tail();
    EXPECT_EQ(TextLines(ran->output).at(0), "0") << ran->output;
  }
  const std::string last_prefix = "kaslr-b" + std::to_string(last);
  ASSERT_TRUE(WriteMarkers(con, last_prefix).ok()) << tail();
  ASSERT_TRUE(con.Send("echo " + last_prefix + "-" + std::to_string(kMarkers + 1) + " > " +
                       kInstance + "/trace_marker; echo c > /proc/sysrq-trigger\n")
                  .ok());
  auto panic = daemon.WaitForCapture(name, "panic", 90s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << tail();
  const fs::path dir = fs::path(daemon.captures_dir(name)) / (*panic)["id"].get<std::string>();
  const json m = json::parse(test_support::ReadText((dir / "manifest.json").string()));
  ASSERT_EQ(m["extra"]["formats"]["decoded"], true) << m["extra"].dump(2);
  const json& boots = m["extra"]["boots"];
  // The reset only moves the ring's pointers (the old pages' bytes stay in
  // region.bin): the earlier boots' markers must be gone from the decoded
  // events.
  const test_support::CommandResult all = test_support::RunCommandStatus(
      std::string(HVTRACE_BIN_DIR) + "/hvtrace show '" + dir.string() + "'");
  ASSERT_EQ(all.status, 0);
  EXPECT_EQ(all.out.find("kaslr-b0-") == std::string::npos, reset);
  // Without reset every boot is in the range; with it only the last.
  ASSERT_EQ(boots.size(), reset ? 1u : truth.size()) << m["validation"].dump(2);
  const int64_t meta_delta = truth[0].delta;  // text_addr: the boot that set the buffer up.
  for (uint32_t b = 0; b < boots.size(); ++b) {
    const size_t guest_boot = reset ? last : b;
    const json& kaslr = boots[b]["decoded_with"]["kaslr"];
    std::printf("[kaslr e2e] %s boot %u (guest boot %zu): truth delta %lld, kaslr %s\n",
                reset ? "reset" : "append", b, guest_boot,
                static_cast<long long>(truth[guest_boot].delta), kaslr.dump().c_str());
    EXPECT_EQ(kaslr.value("delta", int64_t{1}), truth[guest_boot].delta) << kaslr.dump(2);
    EXPECT_EQ(kaslr["source"], "evidence");
    EXPECT_EQ(kaslr["meta_delta"], meta_delta);
    EXPECT_EQ(kaslr["meta_text_addr"],
              truth[guest_boot].delta == meta_delta ? "agrees" : "disagrees (not this boot's)");
    CheckBoot(dir, b, "kaslr-b" + std::to_string(guest_boot),
              kMarkers + (guest_boot == last ? 1 : 0), truth[guest_boot], harvest_syms);
  }
}

TEST(KaslrKexecE2e, KexecAppendingEachBootNamesItsOwnSymbols) { RunKexec(false); }

TEST(KaslrKexecE2e, KexecWithResetNamesTheNewBootDespiteAStaleTextAddr) { RunKexec(true); }

}  // namespace
}  // namespace hvtrace::e2e
