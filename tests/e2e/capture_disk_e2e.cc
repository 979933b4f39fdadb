// Disk use under hvtraced with a real 6.12 guest under TCG, the state
// directory on a small tmpfs of its own:
//   - a guest flooding its console: console.log stays capped and rotated
//     (console_log_size, console_log_files);
//   - the tmpfs filled to the brim: a cheap (manual) capture is refused with
//     an error naming the directory, the free bytes and the need; the
//     guest's panic capture still lands, evicting the older non-panic
//     captures, complete, with nothing half-written committed.
// The figures (sizes, free bytes) are printed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "capture_budget.h"
#include "formats_cache.h"
#include "formats_harvest.h"
#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "vm_console.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kMarker = "/sys/kernel/tracing/instances/boot_map/trace_marker";
constexpr uint64_t kConsoleCap = 64 * 1024;

// Fills the filesystem holding |dir| until a write fails with ENOSPC.
Status FillToTheBrim(const fs::path& dir) {
  const fs::path filler = dir / "filler";
  int fd = ::open(filler.c_str(), O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Error{"cannot create " + filler.string() + ": " + std::strerror(errno)};
  std::vector<char> chunk(64 * 1024, 'f');
  size_t size = chunk.size();
  for (;;) {
    ssize_t n = ::write(fd, chunk.data(), size);
    if (n > 0) continue;
    if (n < 0 && errno == ENOSPC && size > 1) {
      size /= 2;  // Down to the last byte.
      continue;
    }
    break;
  }
  const int err = errno;
  ::close(fd);
  if (err != ENOSPC) return Error{"filling " + filler.string() + ": " + std::strerror(err)};
  return {};
}

uint64_t Free(const fs::path& dir) {
  Result<uint64_t> free = hostd::FreeBytes(dir);
  return free.ok() ? *free : 0;
}

std::vector<std::string> Listing(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The state directory on a tmpfs of its own. The daemon is stopped and its
// QEMU killed before the tmpfs goes (the harness finds QEMUs through it).
class StateTmpfs {
 public:
  StateTmpfs(HvtracedProcess& daemon, const std::string& size) : daemon_(daemon) {
    fs::create_directories(daemon.state_dir());
    if (::mount("tmpfs", daemon.state_dir().c_str(), "tmpfs", 0, ("size=" + size).c_str()) != 0) {
      error_ = std::strerror(errno);
    }
  }
  ~StateTmpfs() {
    if (!error_.empty()) return;
    daemon_.Stop(SIGTERM);
    daemon_.KillRecordedVms();
    ::umount2(daemon_.state_dir().c_str(), MNT_DETACH);
  }
  const std::string& error() const { return error_; }

 private:
  HvtracedProcess& daemon_;
  std::string error_;
};

class CaptureDiskE2e : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_F(CaptureDiskE2e, FullStateDirPanicEvictsCheaperCapturesAndConsoleLogIsCapped) {
  auto image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  // The kernel's formats (a cache hit after the first run), so the panic
  // capture is decoded as it would be in production.
  auto cache_root = CacheWithFormatsOf(*image);
  ASSERT_TRUE(cache_root.ok()) << cache_root.error().message;

  HvtracedProcess daemon({.tag = "disk",
                          .config = "cache_dir = " + cache_root->string() +
                                    "\n"
                                    "vm_on_shutdown = stop\n"
                                    "capture_free_reserve = 8M\n"
                                    "console_log_size = 64K\n"
                                    "console_log_files = 2\n",
                          .reap_orphans = true});
  StateTmpfs tmpfs(daemon, "192m");
  if (!tmpfs.error().empty()) GTEST_SKIP() << "cannot mount a tmpfs: " << tmpfs.error();
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  const std::string name = "disk-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(daemon, name, image->kernel, image->initrd);
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  hostd::GuestConsole& console = *guest->console;
  auto tail = [&] { return console.Tail(20) + "\n--- hvtraced ---\n" + daemon.LogTail(); };
  ASSERT_TRUE(console.WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();
  const fs::path state = daemon.state_dir();
  const fs::path captures = daemon.captures_dir(name);
  const fs::path console_log = daemon.vm_dir(name) + "/console.log";

  // 1. The console: ~560 KB printed, far over the 64 KiB cap.
  constexpr int kLines = 8000;
  auto flood = console.Run(
      "seq 1 " + std::to_string(kLines) +
          " | while read i; do echo console-flood-$i-0123456789abcdef0123456789abcdef; done",
      120s);
  ASSERT_TRUE(flood.ok() && flood->status == 0) << tail();
  // Rotation runs every second: wait (with a deadline) for the last round.
  auto size_of = [](const fs::path& p) {
    std::error_code ec;
    const uintmax_t n = fs::file_size(p, ec);
    return ec ? uint64_t{0} : static_cast<uint64_t>(n);
  };
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline &&
         (size_of(console_log) > kConsoleCap || !fs::exists(console_log.string() + ".1"))) {
    std::this_thread::sleep_for(200ms);
  }
  const uint64_t log_now = size_of(console_log);
  ASSERT_TRUE(fs::exists(console_log.string() + ".1")) << "console.log never rotated";
  const uint64_t log_one = size_of(console_log.string() + ".1");
  std::printf(
      "[disk] console: guest printed %zu bytes; console.log %llu, console.log.1 %llu "
      "bytes (cap %llu, 2 files)\n",
      flood->output.size(), static_cast<unsigned long long>(log_now),
      static_cast<unsigned long long>(log_one), static_cast<unsigned long long>(kConsoleCap));
  EXPECT_GT(flood->output.size(), 4 * kConsoleCap);
  EXPECT_LE(log_now, kConsoleCap);
  EXPECT_LE(log_one, kConsoleCap);
  EXPECT_FALSE(fs::exists(console_log.string() + ".2"));

  // 2. Markers, then three cheap (manual) captures.
  auto marked =
      console.Run("for i in $(seq 1 10); do echo disk-mark-$i > " + std::string(kMarker) + "; done",
                  kCommandTimeout);
  ASSERT_TRUE(marked.ok() && marked->status == 0) << tail();
  std::set<std::string> manual_ids;
  for (int i = 0; i < 3; ++i) {
    auto manual = daemon.Call("capture", {{"name", name}});
    ASSERT_TRUE(manual.ok()) << manual.error().message << "\n" << daemon.LogTail();
    manual_ids.insert((*manual)["capture"].get<std::string>());
    std::printf("[disk] manual capture %s: %llu bytes on disk\n",
                (*manual)["capture"].get<std::string>().c_str(),
                static_cast<unsigned long long>(
                    hostd::CaptureDiskBytes(captures / (*manual)["capture"].get<std::string>())));
  }

  // 3. The tmpfs filled to the brim.
  ASSERT_TRUE(FillToTheBrim(state).ok());
  const uint64_t free_full = Free(state);
  std::printf("[disk] state tmpfs (192 MiB) filled: %llu bytes free\n",
              static_cast<unsigned long long>(free_full));

  // A cheap capture is refused before it starts, with the directory, the
  // free bytes and the need; it evicts nothing.
  auto refused = daemon.Call("capture", {{"name", name}});
  ASSERT_FALSE(refused.ok());
  const std::string& why = refused.error().message;
  std::printf("[disk] manual capture refused: %s\n", why.c_str());
  EXPECT_NE(why.find(captures.string()), std::string::npos) << why;
  EXPECT_NE(why.find("bytes"), std::string::npos) << why;
  EXPECT_NE(why.find("free"), std::string::npos) << why;
  EXPECT_NE(why.find("capture_free_reserve"), std::string::npos) << why;
  EXPECT_NE(why.find("needs up to " + std::to_string(hostd::CaptureNeed(16u << 20))),
            std::string::npos)
      << why;
  EXPECT_EQ(Listing(captures).size(), 3u);

  // 4. The guest panics: the capture evicts older non-panic captures to fit.
  ASSERT_TRUE(
      console.Send("echo disk-last > " + std::string(kMarker) + "; echo c > /proc/sysrq-trigger\n")
          .ok());
  auto panic = daemon.WaitForCapture(name, "panic", 120s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << "\n" << daemon.log();
  const fs::path panic_dir = captures / (*panic)["id"].get<std::string>();
  const json manifest = json::parse(ReadWhole((panic_dir / "manifest.json").string()));
  const json disk = manifest["extra"]["disk"];
  std::printf(
      "[disk] panic capture %s: %llu bytes on disk; need %llu, free %llu before and "
      "%llu after evicting %zu capture(s), reserve met: %s; %llu bytes free now\n",
      (*panic)["id"].get<std::string>().c_str(),
      static_cast<unsigned long long>(hostd::CaptureDiskBytes(panic_dir)),
      disk["need_bytes"].get<unsigned long long>(),
      disk["free_bytes_before"].get<unsigned long long>(),
      disk["free_bytes_after_evicting"].get<unsigned long long>(), disk["evicted"].size(),
      disk["reserve_met"].get<bool>() ? "yes" : "no", static_cast<unsigned long long>(Free(state)));
  ASSERT_FALSE(disk["evicted"].empty()) << manifest.dump(2);
  for (const json& evicted : disk["evicted"]) {
    const std::string id = evicted.get<std::string>().substr(name.size() + 1);
    EXPECT_EQ(manual_ids.count(id), 1u) << "evicted a capture that was not a manual one: " << id;
    EXPECT_FALSE(fs::exists(captures / id));
  }
  EXPECT_LE(disk["free_bytes_before"].get<uint64_t>(), free_full + (1u << 20));

  // Complete: the region with every marker, decoded, and files[] is exactly
  // what the directory holds (nothing half-written, no recovery record).
  EXPECT_FALSE(manifest["extra"].contains("incomplete")) << manifest["extra"].dump(2);
  const std::string region = ReadWhole((panic_dir / "region.bin").string());
  EXPECT_EQ(region.size(), 16u << 20);
  for (int i = 1; i <= 10; ++i) {
    EXPECT_NE(region.find("disk-mark-" + std::to_string(i) + "\n"), std::string::npos) << i;
  }
  std::vector<std::string> listed;
  for (const json& f : manifest["files"]) listed.push_back(f["name"]);
  listed.push_back("manifest.json");
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(Listing(panic_dir), listed);
  EXPECT_NE(std::find(listed.begin(), listed.end(), "region.bin"), listed.end());
  bool decoded = false;
  for (const std::string& f : listed) decoded |= f.ends_with(".trace.dat");
  EXPECT_TRUE(decoded) << manifest["files"].dump();
  for (const std::string& entry : Listing(captures)) {
    EXPECT_FALSE(entry.starts_with(".tmp-")) << "left in " << captures << ": " << entry;
  }
  EXPECT_TRUE(daemon.Call("ping", json::object()).ok());
}

}  // namespace
}  // namespace hvtrace::e2e
