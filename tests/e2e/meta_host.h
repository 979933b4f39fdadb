// The host end of the agent's metadata channel for tests that boot a guest
// under plain QEMU with the channel's virtio-serial port on a socket
// (`meta::kMetaPortName`), as hvtraced connects to it: frames read and
// decoded with the host's own decoder, and a kBoot archive checked with the
// host's own parsers.
#ifndef HVTRACE_TESTS_E2E_META_HOST_H_
#define HVTRACE_TESTS_E2E_META_HOST_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "disk_guest.h"
#include "hvtrace/meta_channel.h"

namespace hvtrace::e2e {

// QEMU's -device/-chardev arguments for the channel's port, its host end a
// listening socket at |socket_path| (server=on,wait=off: the guest boots
// whether or not the test has connected).
std::vector<std::string> MetaPortArgs(const std::string& socket_path);

// One connection to QEMU's chardev socket.
class MetaHost {
 public:
  explicit MetaHost(std::string path) : path_(std::move(path)) {}
  ~MetaHost() { Disconnect(); }
  MetaHost(const MetaHost&) = delete;
  MetaHost& operator=(const MetaHost&) = delete;

  // Connects, retrying until |timeout|, and says hello (as hvtraced does); a
  // new connection starts with no frames.
  bool Connect(std::chrono::milliseconds timeout);
  void Disconnect();
  // Reads frames until |done| says so or |timeout| passes.
  bool ReadUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout);
  const meta::MetaFrame* Find(meta::MetaType type) const;

  std::vector<meta::MetaFrame> frames;  // This connection's.
  std::vector<std::string> errors;      // All connections'.
  uint64_t boot_wire = 0;  // This connection's stream bytes up to its first kBoot's end.

 private:
  std::string path_;
  int fd_ = -1;
  meta::MetaDecoder decoder_;
};

// Checks one kBoot archive against |image| (its harvest members parse, every
// fingerprint matches its format, identity.json names this boot) with gtest
// expectations; returns identity.json.
std::string CheckBootArchive(const meta::MetaFrame& boot, const DiskImage& image);

// The string value of |key| in a flat JSON text, or "<absent>".
std::string JsonField(const std::string& json, const std::string& key);

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_META_HOST_H_
