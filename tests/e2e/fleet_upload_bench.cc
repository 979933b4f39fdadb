// bench/upload.sh: what uploading real captures costs, against the real
// store, with the peer measured in the same run. Runs only with
// HVTRACE_BENCH_UPLOAD=1 (it is not a test: it asserts no timing).
//
// A real 6.12 guest under TCG writes trace_marker events; hvtraced (with the
// upload on) takes N manual captures one after the other. For each: the
// time from the capture's reply to its upload confirmed in ping, the CPU
// time of hvtraced's upload thread (hvt-upload, /proc/PID/task/TID/stat), the
// bytes on disk and in the store. The peer: `curl --aws-sigv4 -T` PUTs of
// the very bytes the store holds for the last capture (what a hand-written
// script would cost), and memcpy of those bytes (the limit).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fleet_e2e_support.h"
#include "fleet_keys.h"
#include "formats_cache.h"
#include "guest_harness.h"
#include "host_command.h"
#include "hvtraced_harness.h"
#include "s3_client.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// utime + stime of |pid|'s thread named |comm|, in ms; -1 when absent.
double ThreadCpuMs(pid_t pid, const std::string& comm) {
  const fs::path tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& t : fs::directory_iterator(tasks, ec)) {
    std::string name = ReadWhole((t.path() / "comm").string());
    while (!name.empty() && name.back() == '\n') name.pop_back();
    if (name != comm) continue;
    const std::string stat = ReadWhole((t.path() / "stat").string());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) return -1;
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    return static_cast<double>(utime + stime) * 1000.0 /
           static_cast<double>(::sysconf(_SC_CLK_TCK));
  }
  return -1;
}

double ChildrenCpuMs() {
  rusage ru{};
  ::getrusage(RUSAGE_CHILDREN, &ru);
  auto ms = [](const timeval& tv) { return tv.tv_sec * 1000.0 + tv.tv_usec / 1000.0; };
  return ms(ru.ru_utime) + ms(ru.ru_stime);
}

TEST(FleetUploadBench, RealCapturesAgainstCurlAndMemcpy) {
  if (std::getenv("HVTRACE_BENCH_UPLOAD") == nullptr) GTEST_SKIP() << "bench/upload.sh runs it";
  HVTRACE_REQUIRE_CEPH(ceph);
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  auto cache_root = hostd::DefaultCacheRoot();
  ASSERT_TRUE(cache_root.ok());
  ASSERT_TRUE(HarvestImage(*image, *cache_root).ok());
  const std::string bucket = "fleet-bench";
  ASSERT_TRUE(ceph.CreateBucket(bucket).ok());
  auto creds = ceph.WriteCredentials("bench.creds", ceph.access_key(), ceph.secret_key());
  ASSERT_TRUE(creds.ok());
  HvtracedProcess daemon({.tag = "fleetbench",
                          .config = "vm_on_shutdown = stop\ncapture_retention = 0\ncache_dir = " +
                                    cache_root->string() + "\nupload_endpoint = " +
                                    ceph.endpoint() + "\nupload_bucket = " + bucket +
                                    "\nupload_region = default\nupload_credentials = " + *creds +
                                    "\nupload_prefix = bench\nupload_retry_max = 2s\n"});
  ASSERT_TRUE(daemon.Start().ok());
  const std::string name = "bench-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(daemon, name, image->kernel, image->initrd);
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  ASSERT_TRUE(guest->console->WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok());
  // Fill part of the 16 MiB ring with markers, so trace.dat is not tiny.
  auto ran = guest->console->Run(
      "for i in $(seq 1 3000); do echo upload-bench-marker-$i > "
      "/sys/kernel/tracing/instances/boot_map/trace_marker; done",
      120s);
  ASSERT_TRUE(ran.ok() && ran->status == 0);

  const int n =
      std::getenv("HVTRACE_BENCH_CAPTURES") ? std::atoi(std::getenv("HVTRACE_BENCH_CAPTURES")) : 5;
  hostd::S3Config sc;
  sc.endpoint = ceph.endpoint();
  sc.bucket = bucket;
  sc.region = "default";
  sc.access_key = ceph.access_key();
  sc.secret_key = ceph.secret_key();
  hostd::S3Client s3(sc);
  double total_wall = 0, total_cpu = 0;
  uint64_t total_local = 0, total_stored = 0;
  std::string last_id;
  std::printf("[upload-bench] %-28s %10s %10s %9s %9s %8s\n", "capture", "disk B", "store B",
              "wall ms", "cpu ms", "MB/s");
  for (int i = 0; i < n; ++i) {
    const double cpu0 = ThreadCpuMs(daemon.pid(), "hvt-upload");
    auto cap = daemon.Call("capture", {{"name", name}});
    ASSERT_TRUE(cap.ok()) << cap.error().message;
    const auto t0 = Clock::now();
    const std::string id = (*cap)["capture"];
    const auto deadline = t0 + 120s;
    bool done = false;
    while (!done && Clock::now() < deadline) {
      auto pong = daemon.Call("ping", json::object());
      if (pong.ok()) done = (*pong)["upload"].value("uploaded", 0) == i + 1;
      if (!done) std::this_thread::sleep_for(20ms);
    }
    ASSERT_TRUE(done) << daemon.LogTail();
    const double wall = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const double cpu = ThreadCpuMs(daemon.pid(), "hvt-upload") - cpu0;
    uint64_t local = 0;
    for (const auto& f : fs::directory_iterator(fs::path(daemon.captures_dir(name)) / id)) {
      local += fs::file_size(f.path());
    }
    uint64_t stored = 0;
    auto objects = s3.List(hostd::CaptureKeyPrefix("bench", {hostd::FleetHostName(), name, id}));
    ASSERT_TRUE(objects.ok());
    for (const auto& o : *objects) stored += o.size;
    std::printf("[upload-bench] %-28s %10llu %10llu %9.1f %9.1f %8.1f\n", id.c_str(),
                static_cast<unsigned long long>(local), static_cast<unsigned long long>(stored),
                wall, cpu, static_cast<double>(stored) / (wall / 1000.0) / 1e6);
    total_wall += wall;
    total_cpu += cpu;
    total_local += local;
    total_stored += stored;
    last_id = id;
  }
  std::printf(
      "[upload-bench] hvtraced: %d captures, mean %.1f ms wall and %.1f ms CPU (upload "
      "thread) per capture; %.1f MB/s of stored bytes; disk %.1f MB -> store %.1f MB per "
      "capture\n",
      n, total_wall / n, total_cpu / n,
      static_cast<double>(total_stored) / (total_wall / 1000.0) / 1e6,
      static_cast<double>(total_local) / n / 1e6, static_cast<double>(total_stored) / n / 1e6);

  // The peer: the same stored bytes of the last capture, PUT by curl.
  const std::string base =
      hostd::CaptureKeyPrefix("bench", {hostd::FleetHostName(), name, last_id});
  auto objects = s3.List(base);
  ASSERT_TRUE(objects.ok());
  const fs::path dir = fs::path(ceph.dir()) / "bench-peer";
  fs::create_directories(dir);
  std::vector<fs::path> files;
  uint64_t bytes = 0;
  for (const auto& o : *objects) {
    const fs::path f = dir / o.key.substr(base.size());
    fs::remove(f);
    ASSERT_TRUE(s3.GetToFile(o.key, f, 1ull << 32).ok());
    files.push_back(f);
    bytes += o.size;
  }
  const double child0 = ChildrenCpuMs();
  const auto c0 = Clock::now();
  for (const fs::path& f : files) {
    RunResult r =
        RunArgvStatus({"curl", "-s", "-f", "-S", "--aws-sigv4", "aws:amz:default:s3", "--user",
                       ceph.access_key() + ":" + ceph.secret_key(), "-H",
                       "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-T", f.string(),
                       ceph.endpoint() + "/" + bucket + "/peer/" + f.filename().string()});
    ASSERT_EQ(r.status, 0) << r.output;
  }
  const double curl_wall = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
  const double curl_cpu = ChildrenCpuMs() - child0;
  std::vector<char> src(bytes, 'x'), dst(bytes);
  const auto m0 = Clock::now();
  for (int i = 0; i < 10; ++i) {
    std::memcpy(dst.data(), src.data(), bytes);
    src[static_cast<size_t>(i)] = dst[bytes - 1 - static_cast<size_t>(i)];
  }
  const double memcpy_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - m0).count() / 10;
  std::printf(
      "[upload-bench] peer curl --aws-sigv4 -T (same %zu objects, %.1f MB, no MD5/SHA-256 "
      "of the payload, no compression): %.1f ms wall, %.1f ms CPU (curl processes); "
      "%.1f MB/s\n",
      files.size(), static_cast<double>(bytes) / 1e6, curl_wall, curl_cpu,
      static_cast<double>(bytes) / (curl_wall / 1000.0) / 1e6);
  std::printf("[upload-bench] memcpy of the same bytes: %.2f ms (%.1f GB/s), the limit\n",
              memcpy_ms, static_cast<double>(bytes) / (memcpy_ms / 1000.0) / 1e9);
}

}  // namespace
}  // namespace hvtrace::e2e
