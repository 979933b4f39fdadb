// The metadata channel end to end with a real 6.12 guest under TCG: hvtraced
// boots it (`boot`) with a virtio-serial port org.hvtrace.agent.0, this
// build's agent in the guest sends its kernel's formats, kallsyms and task
// names over it, and hvtraced keeps them for the VM. The daemon's formats
// cache is empty and nothing harvests, so when the guest panics only the
// channel's metadata can decode the boot range: `hvtrace show` prints the
// markers and sched events with symbols and task names.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "attach_region_host.h"
#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "test_support.h"
#include "trace_text.h"
#include "vm_console.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using test_support::ReadText;

// On 6.12 and on 7.3 (another persistent-buffer layout, with the scratch
// area): the channel's metadata decodes either.
class MetaChannelKernelE2e : public ::testing::TestWithParam<const char*> {};

TEST_P(MetaChannelKernelE2e, BootRangeDecodesWithTheChannelsMetadataAlone) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "hvtrace-agent not built";
  }
  auto image = ImageWithThisAgent(GetParam());
  ASSERT_TRUE(image.ok()) << image.error().message;

  // An empty formats cache of the daemon's own, and no initramfs to harvest
  // with (the daemon would harvest the kernel in the background): only the
  // channel can decode.
  char cache_tmpl[] = "/tmp/hvt-meta-cache-XXXXXX";
  ASSERT_NE(::mkdtemp(cache_tmpl), nullptr);
  const fs::path cache = cache_tmpl;
  struct RemoveCache {
    fs::path dir;
    ~RemoveCache() { fs::remove_all(dir); }
  } remove_cache{cache};
  HvtracedProcess daemon({.tag = "meta",
                          .config = "vm_on_shutdown = stop\nharvest_initrd = "
                                    "/nonexistent/hvtrace-no-harvest.img\ncache_dir = " +
                                    cache.string() + "\n"});
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  const std::string name = "meta-e2e-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(daemon, name, image->kernel, image->initrd);
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  ASSERT_FALSE(guest->reply.value("meta_socket", std::string()).empty()) << guest->reply.dump(2);
  hostd::GuestConsole& console = *guest->console;
  auto tail = [&] { return ConsoleAndLog(*guest, daemon); };
  ASSERT_TRUE(console.WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();

  // The agent finds the port and sends this boot's metadata.
  ASSERT_TRUE(console.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)", kCommandTimeout).ok());
  json meta;
  const auto deadline = std::chrono::steady_clock::now() + 300s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto status = daemon.Call("status", {{"name", name}});
    ASSERT_TRUE(status.ok()) << status.error().message;
    meta = (*status)["meta"];
    if (meta.is_object() && meta.value("boots_accepted", 0) >= 1 &&
        meta.value("comms_updates", 0) >= 1) {
      break;
    }
    std::this_thread::sleep_for(500ms);
  }
  auto agent_log = console.Run("cat /tmp/agent.log", kCommandTimeout);
  ASSERT_EQ(meta.value("boots_accepted", 0), 1)
      << meta.dump(2) << "\n--- agent ---\n"
      << (agent_log.ok() ? agent_log->output : "") << tail();
  EXPECT_EQ(meta.value("boots_refused", 0), 0) << meta.dump(2);
  EXPECT_EQ(meta["state"], "connected");
  // The claimed build id is the running kernel's: read from guest memory at
  // the kallsyms' __start_notes (QMP memsave).
  EXPECT_EQ(meta["last_boot"]["verified"]["build_id"], "verified") << meta.dump(2);
  auto boot_id = console.Run("cat /proc/sys/kernel/random/boot_id", kCommandTimeout);
  ASSERT_TRUE(boot_id.ok());
  EXPECT_NE(boot_id->output.find(meta["last_boot"]["boot_id"].get<std::string>()),
            std::string::npos)
      << meta.dump(2);
  std::printf("[meta e2e] channel: %s\n", meta.dump().c_str());
  // What a person sees: `hvtrace status NAME`.
  RunResult shown_status = daemon.Hvtrace({"status", name});
  EXPECT_NE(shown_status.output.find("connected, 1 boots accepted, 0 refused"), std::string::npos)
      << shown_status.output;

  // Markers through the boot instance, then a panic.
  const std::string marker = "/sys/kernel/tracing/instances/boot_map/trace_marker";
  ASSERT_TRUE(
      console.Run("for i in 1 2 3 4 5; do echo hvt-meta-$i > " + marker + "; done", kCommandTimeout)
          .ok());
  ASSERT_TRUE(console.Send("echo c > /proc/sysrq-trigger\n").ok());
  auto panic = daemon.WaitForCapture(name, "panic", 90s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << tail();
  const fs::path dir =
      fs::path(daemon.vm_dir(name)) / "captures" / (*panic)["id"].get<std::string>();
  json m = json::parse(ReadText(dir / "manifest.json"));
  const json& formats = m["extra"]["formats"];
  ASSERT_EQ(formats["decoded"], true) << m["extra"].dump(2);
  EXPECT_EQ(formats["meta"]["boots"], 1) << formats.dump(2);
  const json& boots = m["extra"]["boots"];
  ASSERT_FALSE(boots.empty());
  const json& last = boots.back()["decoded_with"];
  EXPECT_EQ(last["from"], "meta channel") << boots.dump(2);
  EXPECT_EQ(last["comms"], true) << boots.dump(2);
  std::printf("[meta e2e] last boot decoded with: %s\n", last.dump().c_str());
  // 7.3's scratch area: every module loaded once, so none is superseded
  // (stale __init symbols in kallsyms made six of nine so before).
  if (last["kaslr"].contains("module_symbols")) {
    EXPECT_EQ(last["kaslr"]["module_symbols"]["superseded"], json::array()) << last.dump(2);
  }

  // Names and symbols from the channel alone.
  const std::string hvtrace = std::string(HVTRACE_BIN_DIR) + "/hvtrace";
  test_support::CommandResult shown =
      test_support::RunCommandStatus(hvtrace + " show '" + dir.string() + "'");
  ASSERT_EQ(shown.status, 0) << shown.out.substr(0, 2000);
  size_t unparsed = 0;
  const std::vector<TraceEvent> events = ReportTraceEvents(shown.out, &unparsed);
  size_t markers = 0, switches = 0, named = 0;
  for (const TraceEvent& e : events) {
    if (e.name == "tracing_mark_write" && e.text.starts_with("hvt-meta-")) ++markers;
    if (e.name == "sched_switch") ++switches;
    if (e.text.find("<...>") == std::string::npos) ++named;
  }
  std::printf("[meta e2e] show: %zu events, %zu markers, %zu sched_switch, %zu unparsed\n",
              events.size(), markers, switches, unparsed);
  EXPECT_EQ(markers, 5u);
  EXPECT_GT(switches, 0u);
  // The marker writes came from a task the channel named ("sh"), not "<...>".
  EXPECT_NE(shown.out.find("sh-"), std::string::npos) << shown.out.substr(0, 2000);
  EXPECT_GT(named, 0u);
  // Symbols: timer callbacks print as names, not raw addresses.
  size_t symbols = 0;
  for (const TraceEvent& e : events) {
    const size_t at = e.text.find("function=");
    if (at != std::string::npos && e.text.compare(at + 9, 2, "0x") != 0) ++symbols;
  }
  std::printf("[meta e2e] events with a symbol name: %zu\n", symbols);
  EXPECT_GT(symbols, 0u);
  // The formats cache stayed empty: the channel did it all.
  EXPECT_TRUE(fs::is_empty(cache) || !fs::exists(cache / "formats") ||
              fs::is_empty(cache / "formats"));
}

INSTANTIATE_TEST_SUITE_P(Kernels, MetaChannelKernelE2e, ::testing::Values("6.12", "7.3"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return KernelParamName(p.param);
                         });

// The image of ImageWithThisAgent with initrd-kexec.img (the initramfs plus
// the kernel, for hvtrace-kexec-self), this build's agent in both.
Result<std::string> KexecInitrdWithThisAgent(const GuestImage& image) {
  const std::string bin = HVTRACE_BIN_DIR;
  const std::string cmd = std::string(HVTRACE_SOURCE_DIR) +
                          "/qemu-scripts/build-guest.sh --kernel 6.12 --out " + bin +
                          "/../guest-attach --agent " + bin + "/hvtrace-agent" +
                          (access((bin + "/hvtrace-guest-test").c_str(), X_OK) == 0
                               ? " --guest-test " + bin + "/hvtrace-guest-test"
                               : std::string()) +
                          " --with-kexec-kernel > /dev/null 2>&1";
  const std::string initrd = (fs::path(image.initrd).parent_path() / "initrd-kexec.img").string();
  if (std::system(cmd.c_str()) != 0 || !fs::exists(initrd)) {
    return Error{"`" + cmd + "` made no " + initrd};
  }
  return initrd;
}

// Polls status until the channel has accepted |boots| boots and sent comms
// for the last; returns the meta status seen last.
json WaitForChannelBoots(HvtracedProcess& daemon, const std::string& name, uint64_t boots) {
  json meta;
  const auto deadline = std::chrono::steady_clock::now() + 300s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto status = daemon.Call("status", {{"name", name}});
    if (!status.ok()) return json{{"error", status.error().message}};
    meta = (*status)["meta"];
    if (meta.is_object() && meta.value("boots_accepted", uint64_t{0}) >= boots &&
        meta.value("comms_updates", uint64_t{0}) >= boots) {
      break;
    }
    std::this_thread::sleep_for(500ms);
  }
  return meta;
}

// Events of |file| (trace-cmd report) whose timer callback prints as a name.
size_t SymbolNamedEvents(const fs::path& file, size_t* markers, const std::string& prefix) {
  test_support::CommandResult r =
      test_support::RunCommandStatus("trace-cmd report -i '" + file.string() + "'");
  size_t symbols = 0;
  *markers = 0;
  for (const TraceEvent& e : ReportTraceEvents(r.out, nullptr)) {
    const size_t at = e.text.find("function=");
    if (at != std::string::npos && e.text.compare(at + 9, 2, "0x") != 0) ++symbols;
    if (e.name == "tracing_mark_write" && e.text.starts_with(prefix)) ++*markers;
  }
  return symbols;
}

// kexec into the same kernel: each boot sends its own metadata, and each boot
// of the panic capture decodes with its own (its KASLR offset, its task names).
TEST(MetaChannelE2e, KexecThenPanicEachBootDecodesWithItsOwnMetadata) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "hvtrace-agent not built";
  }
  auto image = ImageWithThisAgent("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  Result<std::string> kexec_initrd = KexecInitrdWithThisAgent(*image);
  ASSERT_TRUE(kexec_initrd.ok()) << kexec_initrd.error().message;
  char cache_tmpl[] = "/tmp/hvt-meta-cache-XXXXXX";
  ASSERT_NE(::mkdtemp(cache_tmpl), nullptr);
  struct RemoveCache {
    fs::path dir;
    ~RemoveCache() { fs::remove_all(dir); }
  } remove_cache{cache_tmpl};
  HvtracedProcess daemon({.tag = "metakx",
                          .config = "vm_on_shutdown = stop\nharvest_initrd = "
                                    "/nonexistent/hvtrace-no-harvest.img\ncache_dir = " +
                                    std::string(cache_tmpl) + "\n"});
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  const std::string name = "meta-kexec-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(daemon, name, image->kernel, *kexec_initrd);
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  hostd::GuestConsole& console = *guest->console;
  auto tail = [&] { return ConsoleAndLog(*guest, daemon); };
  const std::string marker = "/sys/kernel/tracing/instances/boot_map/trace_marker";
  std::vector<std::string> boot_ids;
  for (int boot = 0; boot < 2; ++boot) {
    SCOPED_TRACE("boot " + std::to_string(boot));
    ASSERT_TRUE(console.WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();
    ASSERT_TRUE(console.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)", kCommandTimeout).ok());
    json meta = WaitForChannelBoots(daemon, name, boot + 1);
    ASSERT_EQ(meta.value("boots_accepted", 0), boot + 1) << meta.dump(2) << tail();
    boot_ids.push_back(meta["last_boot"]["boot_id"]);
    const std::string prefix = "meta-boot" + std::to_string(boot) + "-";
    ASSERT_TRUE(
        console
            .Run("for i in 1 2 3; do echo " + prefix + "$i > " + marker + "; done", kCommandTimeout)
            .ok());
    // Reuses /proc/cmdline: the new kernel finds the ring and appends to it.
    ASSERT_TRUE(
        console.Send(boot == 0 ? "hvtrace-kexec-self\n" : "echo c > /proc/sysrq-trigger\n").ok());
  }
  ASSERT_NE(boot_ids[0], boot_ids[1]);
  auto panic = daemon.WaitForCapture(name, "panic", 90s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << tail();
  const fs::path dir =
      fs::path(daemon.vm_dir(name)) / "captures" / (*panic)["id"].get<std::string>();
  json m = json::parse(ReadText(dir / "manifest.json"));
  ASSERT_EQ(m["extra"]["formats"]["decoded"], true) << m["extra"].dump(2);
  const json& boots = m["extra"]["boots"];
  ASSERT_EQ(boots.size(), 2u) << m["validation"].dump(2);
  for (size_t boot = 0; boot < 2; ++boot) {
    SCOPED_TRACE("boot " + std::to_string(boot));
    const json& with = boots[boot]["decoded_with"];
    EXPECT_EQ(with["from"], "meta channel") << with.dump(2);
    EXPECT_EQ(with["boot_id"], boot_ids[boot]) << with.dump(2);
    EXPECT_EQ(with["comms"], true);
    size_t markers = 0;
    const size_t symbols = SymbolNamedEvents(dir / boots[boot]["file"].get<std::string>(), &markers,
                                             "meta-boot" + std::to_string(boot) + "-");
    std::printf(
        "[meta e2e] kexec boot %zu (%s): %s events, %zu markers, %zu timer callbacks "
        "by name, kaslr %s\n",
        boot, boot_ids[boot].c_str(), boots[boot]["events"].dump().c_str(), markers, symbols,
        with["kaslr"].dump().c_str());
    EXPECT_EQ(markers, 3u);
    EXPECT_GT(symbols, 0u);
    // The region's meta keeps the first boot's text address: the first
    // channel boot's kallsyms agree with it.
    if (boot == 0) {
      EXPECT_EQ(with["kaslr"]["meta_text_addr"], "agrees") << with.dump(2);
    }
  }
}

}  // namespace
}  // namespace hvtrace::e2e
