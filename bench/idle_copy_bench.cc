// What a panic's copy waits on when the machine has been up for a while: the
// first copy of a guest range out of memory nobody touched for IDLE seconds,
// into a copy buffer nobody touched either (hvtraced reserves it when a VM
// registers; the panic may come minutes later). Four combinations in one
// run, copies staggered so they never overlap:
//   source: a file on a plain tmpfs (as QEMU's boot-range file in /run) or
//           on a tmpfs mounted huge=within_size (root only);
//   buffer: small pages (plain mmap, hvtraced before 2026-12-03) or
//           hostd::PageBuffer (2 MiB-aligned, MADV_HUGEPAGE).
// Each prints the first copy after the idle time (through the mapping, or by pread(2)
// of the file as hvtraced did before 2026-11-25) and a second one right
// after it (the same bytes, warm), beside memcpy of the same size cache-hot
// (the limit). A quarter of the source holds random bytes, the rest zeros,
// like a boot range whose ring is partly used. Nothing is asserted.
//
//   build/bin/idle_copy_bench [IDLE_SECONDS [MIB]]     (default 30 s, 16 MiB)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "page_buffer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Case {
  Case(std::string s, std::string b, bool p = false)
      : source(std::move(s)), buffer(std::move(b)), pread(p) {}
  std::string source, buffer;
  bool pread;  // The first copy by pread(2) of the file, not through the mapping.
  double first = -1, second = -1;
  std::string error;
};

// Maps |bytes| of a new file in |dir| shared, fills a quarter with random
// bytes and faults every page in (as hvtraced's RegionFile warms a range).
char* MapSource(const fs::path& file, size_t bytes, std::string* error) {
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    *error = "cannot make " + file.string() + ": " + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    *error = "cannot map " + file.string() + ": " + std::strerror(errno);
    return nullptr;
  }
  auto* p = static_cast<char*>(map);
  std::mt19937_64 random(42);
  for (size_t i = 0; i + 8 <= bytes / 4; i += 8) {
    const uint64_t v = random();
    std::memcpy(p + i, &v, 8);
  }
  return p;
}

void ReadAll(const fs::path& file, char* dst, size_t bytes, std::string* error) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  size_t done = 0;
  while (fd >= 0 && done < bytes) {
    const ssize_t n = ::pread(fd, dst + done, bytes - done, static_cast<off_t>(done));
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (done != bytes) *error = "pread " + file.string() + ": " + std::strerror(errno);
  if (fd >= 0) ::close(fd);
}

void Run(Case& c, const fs::path& source_dir, size_t bytes, int idle_s, int delay_ms) {
  const fs::path file =
      source_dir / ("idle_copy_" + std::to_string(::getpid()) + "_" + std::to_string(delay_ms));
  char* src = MapSource(file, bytes, &c.error);
  if (src == nullptr) return;
  hvtrace::hostd::PageBuffer huge;
  char* dst = nullptr;
  void* small = MAP_FAILED;
  if (c.buffer == "PageBuffer") {
    if (!huge.Resize(bytes)) c.error = "PageBuffer::Resize failed";
    dst = reinterpret_cast<char*>(huge.span().data());
  } else {
    small = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (small != MAP_FAILED) {
      dst = static_cast<char*>(small);
      std::memset(dst, 0, bytes);  // Faulted in now, as hvtraced did.
    }
  }
  if (dst != nullptr && c.error.empty()) {
    std::this_thread::sleep_for(std::chrono::seconds(idle_s) + std::chrono::milliseconds(delay_ms));
    auto t = Clock::now();
    if (c.pread) {
      ReadAll(file, dst, bytes, &c.error);
    } else {
      std::memcpy(dst, src, bytes);
    }
    c.first = MsSince(t);
    t = Clock::now();
    std::memcpy(dst, src, bytes);
    c.second = MsSince(t);
  }
  if (small != MAP_FAILED) ::munmap(small, bytes);
  ::munmap(src, bytes);
  fs::remove(file);
}

}  // namespace

int main(int argc, char** argv) {
  const int idle_s = argc > 1 ? std::max(0, std::atoi(argv[1])) : 30;
  const size_t bytes = static_cast<size_t>(argc > 2 ? std::max(1, std::atoi(argv[2])) : 16) << 20;
  // A private huge-page tmpfs; without root the huge cases say why they
  // did not run.
  const fs::path huge_dir =
      fs::temp_directory_path() / ("idle_copy_huge_" + std::to_string(::getpid()));
  fs::create_directories(huge_dir);
  const bool mounted = ::mount("tmpfs", huge_dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
                               "mode=0700,huge=within_size") == 0;
  const std::string mount_error = mounted ? "" : std::string("mount: ") + std::strerror(errno);
  const fs::path plain_dir =
      fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  std::vector<Case> cases = {{"tmpfs", "small pages"},
                             {"tmpfs", "PageBuffer"},
                             {"tmpfs huge=within_size", "small pages"},
                             {"tmpfs huge=within_size", "PageBuffer"},
                             {"tmpfs, by pread", "PageBuffer", true},
                             {"tmpfs, by pread", "small pages", true}};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cases.size(); ++i) {
    const bool on_huge = cases[i].source.starts_with("tmpfs huge");
    if (on_huge && !mounted) {
      cases[i].error = mount_error;
      continue;
    }
    threads.emplace_back(Run, std::ref(cases[i]), on_huge ? huge_dir : plain_dir, bytes, idle_s,
                         static_cast<int>(i) * 1500);
  }
  for (std::thread& t : threads) t.join();
  if (mounted) ::umount2(huge_dir.c_str(), MNT_DETACH);
  fs::remove(huge_dir);

  std::vector<char> a(bytes, 1), b(bytes, 0);
  double limit = 1e9;
  for (int i = 0; i < 20; ++i) {
    const auto t = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    limit = std::min(limit, MsSince(t));
  }
  std::printf(
      "# %zu MiB copied after %d s idle; memcpy cache-hot (the limit, best of 20): %.2f ms\n",
      bytes >> 20, idle_s, limit);
  std::printf("%-24s %-12s %12s %12s %10s\n", "source", "buffer", "first ms", "warm ms",
              "first/limit");
  for (const Case& c : cases) {
    if (!c.error.empty()) {
      std::printf("%-24s %-12s not run: %s\n", c.source.c_str(), c.buffer.c_str(), c.error.c_str());
      continue;
    }
    std::printf("%-24s %-12s %12.1f %12.1f %9.1fx\n", c.source.c_str(), c.buffer.c_str(), c.first,
                c.second, c.first / limit);
  }
  return 0;
}
