// The guest's half of the virtio handshakes in the persistent boot buffer
// (issue 15, Build item 2): the 6.12 guest with a virtio-blk disk, a
// virtio-net NIC and a virtio-serial controller boots with the boot range and
// hostd::kHandshakeKprobeParam on its command line. The kernel creates the
// kprobe events before the built-in virtio_pci and virtio_console probe
// (top-level buffer); the initramfs (qemu-scripts/guest/hvtrace-boot-probes)
// enables them in instances/boot_map before it loads virtio_blk and
// virtio_net, and copies the earlier top-level records there as
// "hvtrace-early:" markers; it starts the agent (hvtrace.agent=1), which
// writes its "started" line there. The guest's own view of the instance and
// hvtrace's decode of the host-backed range after a panic must show:
//  - built in, copied: every device's reset (0) and ACKNOWLEDGE (1) inside
//    the virtio_pci_driver_init initcall, and virtio-console's whole
//    handshake 0, 1, 3, 11, 15 inside virtio_console_init;
//  - modules, recorded in the instance: 3 (ACKNOWLEDGE|DRIVER), 11
//    (+FEATURES_OK), 15 (+DRIVER_OK), the feature write before 11;
// with the index of /sys/bus/virtio/devices/virtioN, the same values and
// times in both views. Idle adds no handshake events.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "boot_request.h"
#include "guest_harness.h"
#include "host_command.h"

namespace hvtrace::e2e {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

#define ASSERT_OK(expr)                         \
  do {                                          \
    auto&& _s = (expr);                         \
    ASSERT_TRUE(_s.ok()) << _s.error().message; \
  } while (0)

constexpr char kInstance[] = "/sys/kernel/tracing/instances/boot_map";

struct Write {
  bool early = false;  // An "hvtrace-early:" copy of a top-level record.
  std::string event;   // hvt_virtio_status, hvt_virtio_features, hvt_virtio_queue.
  int index = -1;
  uint64_t value = 0;  // status, features or queue.
  uint64_t ts_us = 0;
};

std::string Key(const Write& w) {
  char text[96];
  std::snprintf(text, sizeof text, "%s%s index=%d value=%llu at %llu us", w.early ? "early " : "",
                w.event.c_str(), w.index, static_cast<unsigned long long>(w.value),
                static_cast<unsigned long long>(w.ts_us));
  return text;
}

// One write from a line of the guest's `trace` text ("... 5.957861:
// hvt_virtio_status: (ip) status=3 index=0") or from a marker's text
// ("hvtrace-early: hvt_virtio_status ts=3.138111 cpu=1 pid=1 status=0 index=0").
bool ParseWrite(const std::string& line, Write* w) {
  static const std::regex kEvent(
      R"(\s([0-9]+)\.([0-9]{6}): (hvt_virtio_\w+): \([^)]*\) (status|features|queue)=(0x[0-9a-f]+|[0-9]+).* index=(-?[0-9]+))");
  static const std::regex kEarly(
      R"(hvtrace-early: (hvt_virtio_\w+) ts=([0-9]+)\.([0-9]{6}) .*(status|features|queue)=(0x[0-9a-f]+|[0-9]+).* index=(-?[0-9]+))");
  std::smatch m;
  if (std::regex_search(line, m, kEarly)) {
    w->early = true;
    w->event = m[1];
    w->ts_us = std::stoull(m[2]) * 1000000 + std::stoull(m[3]);
  } else if (std::regex_search(line, m, kEvent)) {
    w->early = false;
    w->ts_us = std::stoull(m[1]) * 1000000 + std::stoull(m[2]);
    w->event = m[3];
  } else {
    return false;
  }
  w->value = std::stoull(m[5], nullptr, 0);
  w->index = std::stoi(m[6]);
  return true;
}

std::vector<Write> ParseGuestView(const std::string& text) {
  std::vector<Write> out;
  std::istringstream in(text);
  Write w;
  for (std::string line; std::getline(in, line);) {
    if (ParseWrite(line, &w)) out.push_back(w);
  }
  return out;
}

// The initcall's [start, finish] in the guest's view, in microseconds.
std::pair<uint64_t, uint64_t> InitcallSpan(const std::string& text, const std::string& fn) {
  std::pair<uint64_t, uint64_t> span{0, 0};
  const std::regex re(R"(\s([0-9]+)\.([0-9]{6}): initcall_(start|finish): func=)" + fn + R"(\+)");
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, re)) continue;
    const uint64_t us = std::stoull(m[1]) * 1000000 + std::stoull(m[2]);
    (m[3] == "start" ? span.first : span.second) = us;
  }
  return span;
}

std::vector<uint64_t> Statuses(const std::vector<Write>& writes, int index, bool early) {
  std::vector<uint64_t> out;
  for (const Write& w : writes) {
    if (w.event == "hvt_virtio_status" && w.index == index && w.early == early) {
      out.push_back(w.value);
    }
  }
  return out;
}

using Span = std::pair<uint64_t, uint64_t>;

// The guest of the test: the boot range with the default boot events, the
// three virtio devices, the handshake kprobes on the command line, the agent.
hostd::VmConfig HandshakeConfig(const TestGuest& guest, const GuestImage& image) {
  hostd::VmConfig config = guest.MakeConfig(image);
  config.boot_range = hostd::BootRangeConfig{};
  config.boot_range->backing_path = guest.ShmPath("boot");
  config.boot_range->range_bytes = 16 * hostd::kMiB;
  config.boot_range->instance_name = "boot_map";
  config.boot_range->events = hostd::kDefaultBootEvents;
  config.cmdline += std::string(" hvtrace.agent=1 ") + hostd::kHandshakeKprobeParam;
  config.extra_args.insert(
      config.extra_args.end(),
      {"-drive", "driver=null-co,if=none,id=hvt_d0", "-device", "virtio-blk-pci,drive=hvt_d0",
       "-netdev", "user,id=hvt_n0,restrict=on", "-device", "virtio-net-pci,netdev=hvt_n0",
       "-device", "virtio-serial-pci"});
  return config;
}

// Virtio device |id| (1 net, 2 block, 3 console) at |index|: its status
// writes, where the built-in ones happened, features before FEATURES_OK.
void CheckDevice(const std::vector<Write>& writes, int id, int index, Span pci, Span console) {
  SCOPED_TRACE("virtio id " + std::to_string(id) + " = virtio" + std::to_string(index));
  const std::vector<uint64_t> early = Statuses(writes, index, true);
  const std::vector<uint64_t> late = Statuses(writes, index, false);
  if (id == 3) {  // virtio_console is built in: all of it before userspace.
    EXPECT_EQ(early, (std::vector<uint64_t>{0, 1, 3, 11, 15}));
    EXPECT_TRUE(late.empty());
  } else {  // Reset and ACKNOWLEDGE by the built-in virtio_pci, the rest by the module.
    EXPECT_EQ(early, (std::vector<uint64_t>{0, 1}));
    EXPECT_EQ(late, (std::vector<uint64_t>{3, 11, 15}));
  }
  for (const Write& w : writes) {
    if (w.index != index || w.event != "hvt_virtio_status" || !w.early) continue;
    const Span& span = w.value <= 1 ? pci : console;
    EXPECT_GE(w.ts_us, span.first) << Key(w);
    EXPECT_LE(w.ts_us, span.second) << Key(w);
  }
  auto feat = std::find_if(writes.begin(), writes.end(), [&](const Write& w) {
    return w.event == "hvt_virtio_features" && w.index == index;
  });
  auto ok = std::find_if(writes.begin(), writes.end(), [&](const Write& w) {
    return w.event == "hvt_virtio_status" && w.index == index && w.value == 11;
  });
  ASSERT_NE(feat, writes.end()) << "no feature write";
  ASSERT_NE(ok, writes.end());
  EXPECT_LE(feat->ts_us, ok->ts_us);
  EXPECT_NE(feat->value, 0u);
}

// The guest's formats of the events to decode (what a harvest of this
// initramfs records), as a `hvtrace show --formats DIR` directory.
void CopyGuestFormats(TestGuest& guest, const fs::path& dir) {
  for (const char* rel : {"header_page", "header_event", "kprobes/hvt_virtio_status/format",
                          "kprobes/hvt_virtio_features/format", "kprobes/hvt_virtio_queue/format",
                          "ftrace/print/format", "initcall/initcall_start/format",
                          "initcall/initcall_finish/format"}) {
    auto text = guest.Run(std::string("cat /sys/kernel/tracing/events/") + rel);
    ASSERT_OK(text);
    ASSERT_EQ(text->status, 0) << rel;
    const fs::path dest =
        std::string(rel).find('/') == std::string::npos ? dir / rel : dir / "events" / rel;
    fs::create_directories(dest.parent_path());
    std::ofstream(dest) << text->output;
  }
}

// The handshake writes in `hvtrace show --json` output: the kprobe events and
// the "hvtrace-early:" copies; |agent_line| whether the agent's start is there.
std::vector<Write> DecodedWrites(const std::string& output, bool* agent_line) {
  std::vector<Write> decoded;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("event") || !j["event"].is_string()) continue;
    const std::string name = j["event"];
    Write w;
    if (name == "print") {
      const std::string buf = j["fields"].value("buf", "");
      *agent_line |= buf.rfind("hvtrace-agent: started pid", 0) == 0;
      if (ParseWrite(buf, &w) && w.early) decoded.push_back(w);
      continue;
    }
    if (name.rfind("hvt_virtio_", 0) != 0) continue;
    const json& f = j["fields"];
    w.early = false;
    w.event = name;
    w.index = f.value("index", -1);
    w.value = f.contains("status")  ? f["status"].get<uint64_t>()
              : f.contains("queue") ? f["queue"].get<uint64_t>()
                                    : f.value("features", uint64_t{0});
    // Rounded to the microsecond as the kernel's `trace` prints it (ns2usecs).
    w.ts_us = (j["ts_ns"].get<uint64_t>() + 500) / 1000;
    decoded.push_back(w);
  }
  return decoded;
}

struct RemoveOnExit {
  fs::path path;
  ~RemoveOnExit() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

TEST(GuestHandshakeE2eTest, StatusWritesOfEachDeviceInThePersistentBuffer) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access(BinPath("hvtrace-agent").c_str(), X_OK) != 0) GTEST_SKIP() << "no hvtrace-agent";
  auto image = FindGuestImage("6.12");
  ASSERT_OK(image);
  TestGuest guest("hs");
  const hostd::VmConfig config = HandshakeConfig(guest, *image);
  ASSERT_OK(guest.Boot(config));
  const hostd::BootRangeLayout layout = *guest.vm().plan().boot_range;

  // Which virtioN is which device.
  auto ids = guest.Run(
      "for d in /sys/bus/virtio/devices/virtio*; do echo ${d##*virtio} $(cat $d/device); done");
  ASSERT_OK(ids);
  std::map<int, int> index_of;  // virtio device id -> index.
  {
    std::istringstream in(ids->output);
    for (int index = 0, id = 0; in >> index >> std::hex >> id >> std::dec;) index_of[id] = index;
  }
  ASSERT_EQ(index_of.count(1) + index_of.count(2) + index_of.count(3), 3u)
      << ids->output << guest.Diagnostics();

  const std::string grep =
      std::string("grep -E '") +
      "hvt_virtio_|: hvtrace-(early|agent|boot-probes):|func=virtio_pci_driver_init|" +
      "func=virtio_console_init' " + kInstance + "/trace";
  auto view = guest.Run(grep);
  ASSERT_OK(view);
  std::printf("[handshake e2e] the guest's instances/boot_map/trace:\n%s", view->output.c_str());
  const std::vector<Write> guest_writes = ParseGuestView(view->output);
  EXPECT_NE(view->output.find("hvtrace-boot-probes: virtio handshake probes with index: "),
            std::string::npos);
  EXPECT_TRUE(std::regex_search(view->output, std::regex("hvtrace-agent: started pid [0-9]+")))
      << "the agent's start is not in the boot instance";
  const Span pci = InitcallSpan(view->output, "virtio_pci_driver_init");
  const Span console = InitcallSpan(view->output, "virtio_console_init");
  ASSERT_LT(pci.first, pci.second) << "no virtio_pci_driver_init initcall";
  ASSERT_LT(console.first, console.second) << "no virtio_console_init initcall";
  for (int id : {1, 2, 3}) CheckDevice(guest_writes, id, index_of[id], pci, console);

  // Idle: no handshake events come (the probes stay enabled).
  auto count = [&]() {
    auto r = guest.Run(std::string("grep -c hvt_virtio ") + kInstance + "/trace");
    return r.ok() ? r->output : std::string("?");
  };
  const std::string before = count();
  sleep(3);
  EXPECT_EQ(count(), before) << "handshake events while idle";

  const RemoveOnExit formats{fs::path("/tmp") / ("hvt-hs-formats-" + std::to_string(getpid()))};
  fs::remove_all(formats.path);
  CopyGuestFormats(guest, formats.path);
  ASSERT_FALSE(HasFatalFailure());

  ASSERT_OK(guest.console().Send("echo c > /proc/sysrq-trigger\n"));
  auto panicked = guest.qmp().WaitForEvent("GUEST_PANICKED", 60s);
  ASSERT_TRUE(panicked.ok()) << panicked.error().message << "\n" << guest.Diagnostics();

  // The range, cut out of the host file the guest's node 1 lives in.
  const fs::path region = formats.path / "region.bin";
  {
    std::ifstream in(config.boot_range->backing_path, std::ios::binary);
    std::string bytes(layout.range_bytes, '\0');
    in.seekg(static_cast<std::streamoff>(layout.file_offset));
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_EQ(static_cast<uint64_t>(in.gcount()), layout.range_bytes);
    std::ofstream(region, std::ios::binary) << bytes;
  }
  RunResult shown =
      RunArgvStatus({BinPath("hvtrace"), "show", "--json", "--region", region.string(), "--formats",
                     formats.path.string(), "--cpus", "2"});
  ASSERT_EQ(shown.status, 0) << shown.output.substr(0, 4000);
  bool agent_line = false;
  const std::vector<Write> decoded = DecodedWrites(shown.output, &agent_line);
  EXPECT_TRUE(agent_line) << "hvtrace show has no agent start line";
  ASSERT_EQ(decoded.size(), guest_writes.size()) << shown.output.substr(0, 4000);
  size_t same = 0;
  for (size_t i = 0; i < decoded.size(); ++i) {
    EXPECT_EQ(Key(decoded[i]), Key(guest_writes[i])) << "write " << i;
    same += Key(decoded[i]) == Key(guest_writes[i]);
  }
  std::printf(
      "[handshake e2e] %zu handshake writes in the guest's view, %zu decoded by hvtrace "
      "show --region, %zu identical (event, index, value, time to the us)\n",
      guest_writes.size(), decoded.size(), same);
}

}  // namespace
}  // namespace hvtrace::e2e
