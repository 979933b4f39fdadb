// The metadata channel's host end for e2e tests (meta_host.h).
#include "meta_host.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <regex>
#include <span>
#include <sstream>

#include "formats_bundle.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"

namespace hvtrace::e2e {

using Clock = std::chrono::steady_clock;

bool MetaHost::Connect(std::chrono::milliseconds timeout) {
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
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      // As hvtraced does: the agent may not see a quick reconnect otherwise.
      const std::vector<std::byte> hello = meta::EncodeHello("e2e");
      return write(fd_, hello.data(), hello.size()) == static_cast<ssize_t>(hello.size());
    }
    close(fd_);
    fd_ = -1;
    usleep(100000);
  }
  return false;
}

void MetaHost::Disconnect() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool MetaHost::ReadUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
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

const meta::MetaFrame* MetaHost::Find(meta::MetaType type) const {
  for (const auto& f : frames)
    if (f.type == type) return &f;
  return nullptr;
}

std::vector<std::string> MetaPortArgs(const std::string& socket_path) {
  return {"-device",
          "virtio-serial-pci,id=hvtrace-vser",
          "-chardev",
          "socket,id=hvtrace-meta,path=" + socket_path + ",server=on,wait=off",
          "-device",
          "virtserialport,bus=hvtrace-vser.0,chardev=hvtrace-meta,name=" +
              std::string(meta::kMetaPortName)};
}

namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace

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

}  // namespace hvtrace::e2e
