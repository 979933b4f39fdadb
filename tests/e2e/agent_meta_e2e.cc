// The agent's metadata channel on the Debian disk image under plain QEMU: a
// virtio-serial port named org.hvtrace.agent.0 whose host end is a socket
// this test connects to (as hvtraced will). hvtrace-agent.service finds the
// port (Debian loads virtio_console as a module, udev links it), sends the
// boot archive, task names and clock samples; a host that disconnects and
// comes back gets the boot archive again. The archive is checked with the
// host's own parsers: a harvest ParseHarvestArchive accepts, this boot's id
// (as the guest's demo service prints it), the image's kernel release,
// fingerprints that match the formats, kallsyms with real addresses.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "attach_region_host.h"
#include "disk_guest.h"
#include "formats_bundle.h"
#include "guest_harness.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"
#include "hvtrace/meta_channel.h"

namespace hvtrace::e2e {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::chrono::milliseconds kDiskBootTimeout = 300s;

// The host end of the channel: one connection to QEMU's chardev socket.
class MetaHost {
 public:
  explicit MetaHost(std::string path) : path_(std::move(path)) {}
  ~MetaHost() { Disconnect(); }

  bool Connect(std::chrono::milliseconds timeout) {
    Disconnect();
    decoder_ = meta::MetaDecoder();
    frames.clear();
    boot_wire = 0;
    const auto until = Clock::now() + timeout;
    while (Clock::now() < until) {
      fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
      if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return true;
      close(fd_);
      fd_ = -1;
      usleep(100000);
    }
    return false;
  }
  void Disconnect() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  // Reads frames until |done| says so or |timeout| passes.
  bool ReadUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    while (!done()) {
      if (Clock::now() >= until || fd_ < 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char buf[65536];
      const ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0) return false;
      decoder_.Feed(std::span(reinterpret_cast<const std::byte*>(buf), static_cast<size_t>(n)));
      while (auto f = decoder_.Next()) {
        if (!f->ok()) {
          errors.push_back(f->error().message);
          continue;
        }
        if ((*f)->type == meta::MetaType::kBoot && boot_wire == 0) boot_wire = decoder_.offset();
        frames.push_back(std::move(**f));
      }
    }
    return true;
  }
  const meta::MetaFrame* Find(meta::MetaType type) const {
    for (const auto& f : frames)
      if (f.type == type) return &f;
    return nullptr;
  }

  std::vector<meta::MetaFrame> frames;  // This connection's.
  std::vector<std::string> errors;      // All connections'.
  uint64_t boot_wire = 0;  // This connection's stream bytes up to its first kBoot's end.

 private:
  std::string path_;
  int fd_ = -1;
  meta::MetaDecoder decoder_;
};

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string JsonField(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\": \"([^\"]*)\""))) return "<absent>";
  return m[1];
}

// Checks one kBoot archive; returns identity.json.
std::string CheckBootArchive(const meta::MetaFrame& boot, const DiskImage& image) {
  auto members = hostd::ReadTar(Bytes(boot.payload));
  EXPECT_TRUE(members.ok()) << members.error().message;
  if (!members.ok()) return {};
  std::map<std::string, std::string> by_name;
  for (auto& m : *members) by_name[m.name] = std::move(m.data);
  // The harvest members, as a harvest archive, pass the host's parser.
  std::string harvest;
  {
    auto tar_of = [](const std::map<std::string, std::string>& files) {
      std::string out;
      for (const auto& [name, data] : files) {
        char h[512] = {};
        std::snprintf(h, 100, "%s", name.c_str());
        std::snprintf(h + 100, 8, "%07o", 0644);
        std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(data.size()));
        h[156] = '0';
        std::memcpy(h + 257, "ustar", 6);
        std::memset(h + 148, ' ', 8);
        unsigned sum = 0;
        for (char c : h) sum += static_cast<unsigned char>(c);
        std::snprintf(h + 148, 8, "%06o", sum);
        out.append(h, 512).append(data).append((512 - data.size() % 512) % 512, '\0');
      }
      return out.append(1024, '\0');
    };
    std::map<std::string, std::string> only = by_name;
    only.erase("identity.json");
    only.erase("fingerprints");
    harvest = tar_of(only);
  }
  auto bundle = hostd::ParseHarvestArchive(Bytes(harvest));
  EXPECT_TRUE(bundle.ok()) << bundle.error().message;
  if (bundle.ok()) {
    EXPECT_EQ(bundle->release, image.release);
    EXPECT_GT(bundle->events.size(), 500u);
    EXPECT_GT(bundle->kallsyms_nonzero_addresses, 1000u)
        << "kallsyms without addresses: the unit lacks CAP_SYSLOG?";
    std::printf(
        "[agent-meta] archive: %zu events (%zu unparsed), %zu symbols (%zu with an "
        "address), release %s\n",
        bundle->events.size(), bundle->unparsed, bundle->kallsyms_symbols,
        bundle->kallsyms_nonzero_addresses, bundle->release.c_str());
    for (const hostd::HarvestedEvent& ev : bundle->events) {
      if (!ev.parse_error.empty()) {
        std::printf("[agent-meta] unparsed (listed, no fingerprint): %s/%s: %s\n",
                    ev.system.c_str(), ev.name.c_str(), ev.parse_error.c_str());
      }
    }
  }
  // Every fingerprint line matches its format, recomputed here.
  auto listed = hostd::SplitFormatListing(by_name["formats"]);
  EXPECT_TRUE(listed.ok());
  std::map<std::string, std::pair<uint32_t, uint64_t>> want;
  if (listed.ok()) {
    for (const auto& ev : *listed) {
      auto parsed = ParseEventFormat(ev.system, ev.text);
      if (parsed.ok()) want[ev.system + "/" + ev.name] = {parsed->id, EventFingerprint(*parsed)};
    }
  }
  std::istringstream lines(by_name["fingerprints"]);
  std::string name, fp;
  uint32_t id = 0;
  size_t matched = 0;
  while (lines >> name >> id >> fp) {
    auto it = want.find(name);
    if (it == want.end()) {
      ADD_FAILURE() << "fingerprint of " << name << ", which has no parsed format";
      continue;
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(it->second.second));
    EXPECT_EQ(id, it->second.first) << name;
    EXPECT_EQ(fp, hex) << name;
    ++matched;
  }
  EXPECT_EQ(matched, want.size());
  const std::string& identity = by_name["identity.json"];
  EXPECT_EQ(JsonField(identity, "release"), image.release) << identity;
  EXPECT_TRUE(std::regex_match(JsonField(identity, "build_id"), std::regex("[0-9a-f]{40}")))
      << identity;
  EXPECT_EQ(JsonField(identity, "boot_id"), meta::BootIdString(boot.boot_id));
  std::printf("[agent-meta] fingerprints: %zu match their formats; identity %s", matched,
              identity.c_str());
  return identity;
}

TEST(AgentMetaE2eTest, DebianAgentSendsBootArchiveCommsAndResendsAfterReconnect) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) {
    GTEST_SKIP() << "QEMU cannot run here: " << why;
  }
  std::string skip_reason;
  auto image = FindDebianImage(&skip_reason);
  if (!skip_reason.empty()) GTEST_SKIP() << skip_reason;
  ASSERT_TRUE(image.ok()) << image.error().message;

  const std::string sock = "/tmp/hvt-meta-" + std::to_string(getpid()) + ".sock";
  unlink(sock.c_str());
  DiskGuest guest("meta");
  const auto started = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - started).count(); };
  ASSERT_TRUE(
      guest
          .Boot(*image, {"-device", "virtio-serial-pci,id=hvtrace-vser", "-chardev",
                         "socket,id=hvtrace-meta,path=" + sock + ",server=on,wait=off", "-device",
                         "virtserialport,bus=hvtrace-vser.0,chardev=hvtrace-meta,name=" +
                             std::string(meta::kMetaPortName)})
          .ok())
      << guest.Diagnostics();
  MetaHost host(sock);
  ASSERT_TRUE(host.Connect(30s)) << "cannot connect to " << sock << "\n" << guest.Diagnostics();

  // The first kBoot: from the initramfs agent when Debian's initramfs loads
  // virtio_console (it does), else from the unit's.
  ASSERT_TRUE(
      host.ReadUntil([&] { return host.Find(meta::MetaType::kBoot) != nullptr; }, kDiskBootTimeout))
      << guest.Diagnostics();
  std::printf(
      "[agent-meta] %6.1f s  first kBoot since QEMU started: %zu bytes raw, %llu on the "
      "wire\n",
      seconds(), host.Find(meta::MetaType::kBoot)->payload.size(),
      static_cast<unsigned long long>(host.boot_wire));

  // The unit's agent (the initramfs one may have sent before it) reports
  // the port and its archive on the console.
  auto unit_line = guest.console().WaitForMatch(
      std::regex("hvtrace-agent\\[[0-9]+\\]: hvtrace-agent: (boot archive: .*)"), kDiskBootTimeout);
  ASSERT_TRUE(unit_line.ok()) << unit_line.error().message << "\n" << guest.Diagnostics();
  std::printf("[agent-meta] %6.1f s  unit agent: %s\n", seconds(), (*unit_line)[1].c_str());
  // The demo service prints it before or after the agent's line: searched
  // in the whole console log, not after the last match.
  std::string boot_id;
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::smatch m;
        const std::string log = guest.ConsoleLog();
        if (!std::regex_search(log, m, std::regex("hvtrace-demo-marker: boot_id ([0-9a-f-]{36})")))
          return false;
        boot_id = m[1];
        return true;
      },
      kDiskBootTimeout))
      << "the demo service never printed the boot id\n"
      << guest.Diagnostics();

  // What the first connection got: a kBoot, then task names.
  ASSERT_TRUE(host.ReadUntil(
      [&] { return host.Find(meta::MetaType::kBoot) && host.Find(meta::MetaType::kComms); }, 120s))
      << "frames: " << host.frames.size() << "\n"
      << guest.Diagnostics();
  std::printf("[agent-meta] %6.1f s  first connection: kBoot and kComms (%zu frames)\n", seconds(),
              host.frames.size());
  EXPECT_EQ(meta::BootIdString(host.Find(meta::MetaType::kBoot)->boot_id), boot_id);

  // A host that goes and comes back (a daemon restart) gets everything
  // again, from the unit's agent: the initramfs one is long gone.
  host.Disconnect();
  usleep(500000);
  ASSERT_TRUE(host.Connect(10s));
  const double reconnected = seconds();
  ASSERT_TRUE(host.ReadUntil(
      [&] {
        return host.Find(meta::MetaType::kBoot) && host.Find(meta::MetaType::kComms) &&
               host.Find(meta::MetaType::kClock);
      },
      120s))
      << "frames after reconnecting: " << host.frames.size() << "\n"
      << guest.Diagnostics();
  const meta::MetaFrame& boot = host.frames.front();
  EXPECT_EQ(boot.type, meta::MetaType::kBoot) << "the first frame of a connection is kBoot";
  EXPECT_EQ(boot.sequence, 0u);
  EXPECT_EQ(meta::BootIdString(boot.boot_id), boot_id);
  std::printf(
      "[agent-meta] %6.1f s  after reconnecting: kBoot %zu bytes raw, %llu on the wire "
      "(%.1f s after the reconnect)\n",
      seconds(), boot.payload.size(), static_cast<unsigned long long>(host.boot_wire),
      seconds() - reconnected);
  const std::string identity = CheckBootArchive(boot, *image);
  EXPECT_EQ(JsonField(identity, "boot_id"), boot_id);
  const meta::MetaFrame* comms = host.Find(meta::MetaType::kComms);
  // "pid comm" lines; with no event enabled (no region here) the kernel may
  // have saved no name yet, and the agent still sends the (empty) list.
  {
    std::istringstream lines(comms->payload);
    const std::regex pid_comm("[0-9]+ .+");
    for (std::string line; std::getline(lines, line);)
      EXPECT_TRUE(std::regex_match(line, pid_comm)) << line;
  }
  std::printf("[agent-meta] kComms: %zu bytes\n", comms->payload.size());
  EXPECT_NE(host.Find(meta::MetaType::kClock)->payload.find("\"tsc\": "), std::string::npos);
  for (size_t i = 0; i < host.frames.size(); ++i) EXPECT_EQ(host.frames[i].sequence, i);
  for (const std::string& e : host.errors) ADD_FAILURE() << "decoder: " << e;

  // The ACPI power button works once logind runs (the frames above may come
  // before it). Not multi-user.target: with no region the demo service holds
  // it back ~30 s, and once the getty owns ttyS0 systemd stops saying so.
  const std::regex logind("Started .*systemd-logind\\.service");
  EXPECT_TRUE(
      WaitUntil([&] { return std::regex_search(guest.ConsoleLog(), logind); }, kDiskBootTimeout))
      << guest.Diagnostics();
  const std::string log = guest.ConsoleLog();
  EXPECT_EQ(log.find("FAILED"), std::string::npos) << guest.Diagnostics();
  ASSERT_TRUE(guest.PowerOff(120s).ok()) << guest.Diagnostics();
  unlink(sock.c_str());
}

}  // namespace
}  // namespace hvtrace::e2e
