// Panic -> capture latency through hvtraced with real guests (issue 16 item
// 2): boots a TCG guest with a 16 MiB boot range N times (default 5), makes
// each panic (sysrq c), and reads the capture hvtraced commits.
//
// "Panic" is hvtraced's receipt of QEMU's QMP GUEST_PANICKED event: the
// HostTime stamped when the daemon parses the event (qmp_vm.cc ToVmEvent),
// the capture's "triggered" time. Every figure counts from there:
//   region durable   timing_ms.trigger_to_recoverable: region.bin fdatasynced
//                    and its recovery record durable (the capture survives a
//                    daemon or host crash from here on).
//   decoded          timing_ms.trigger_to_decoded: the trace.dat files written,
//                    and with them each boot's kernel log and the crash
//                    summary (issue #42): why the guest died is ready here.
//   committed        status last_capture.trigger_to_disk_ms: manifest and
//                    every file fsynced, the directory renamed into place.
// QEMU's own emission stamp of the event (qemu_timestamp_us) is printed too,
// to show how long the event took to reach the daemon.
//
// Usage: capture_latency [RUNS [DAEMON [KERNEL]]]: DAEMON is a binary in
// build/bin (default hvtraced), e.g. a copy built from another commit, to
// compare; KERNEL a test guest of build-guest.sh (default 6.12; 7.3 reads the
// 6.15+ layout with its scratch area).
// HVTRACE_BENCH_KEEP=DIR copies each capture there (region.bin and all) to
// replay its decode offline.
//
// The limit: memcpy of the same 16 MiB into a buffer already faulted in,
// timed in this process in the same run. Nothing here asserts a timing.
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "formats_cache.h"
#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "test_support.h"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace hvtrace;
using namespace hvtrace::e2e;

constexpr uint64_t kRangeBytes = 16u << 20;

struct Stats {
  double min = 0, median = 0, max = 0;
};

Stats Summarize(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return {v.front(), median, v.back()};
}

// The fastest of 20 memcpys of |bytes| into a destination touched beforehand.
double MemcpyMs(uint64_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 1e9;
  for (int i = 0; i < 20; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
    src[static_cast<size_t>(i) % bytes] = dst[bytes - 1];  // Keep the copies observable.
  }
  return best;
}

// The median of 9 memcpys of |bytes| whose source and destination were first
// pushed out of the caches (this machine: 32 MiB of L3, which holds a 16 MiB
// copy's both ends) by reading 128 MiB of other memory: a panic copies bytes
// the guest wrote while the host did other things.
double ColdMemcpyMs(uint64_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::vector<uint64_t> other((128u << 20) / sizeof(uint64_t), 3);
  std::vector<double> v;
  uint64_t sum = 0;
  for (int i = 0; i < 9; ++i) {
    for (uint64_t x : other) sum += x;  // Plain loads: they fill the caches.
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const auto t1 = std::chrono::steady_clock::now();
    v.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    src[static_cast<size_t>(i)] = static_cast<char>(dst[bytes - 1] + static_cast<char>(sum & 1));
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The daemon's run directory, where QEMU's guest memory files go, on a tmpfs
// as /run is on a host. On this machine /run and /tmp are on the root ext4:
// a guest's memory there is written back to disk while it runs, and those
// flushes land in the panic's copy and fsyncs (copies of 20-50 ms in 3 of 5
// panics, 2 ms in the others). HVTRACE_BENCH_RUN_ON_DISK=1 keeps it on disk.
// The tmpfs is mounted huge=within_size, so QEMU's boot-range file is made of
// 2 MiB pages (HVTRACE_BENCH_SMALL_PAGES=1: of 4 KiB pages, as in a plain
// /run): after a minute's idle a 16 MiB copy out of small pages took 30-37 ms
// of the panic on this machine kind, out of huge ones 4.5-7 ms
// (bench/idle_copy_bench, bench/README.md).
class RunDirOnTmpfs {
 public:
  explicit RunDirOnTmpfs(const std::string& dir) : dir_(dir) {
    if (std::getenv("HVTRACE_BENCH_RUN_ON_DISK") != nullptr) return;
    std::error_code ec;
    fs::create_directories(dir, ec);
    small_pages_ = std::getenv("HVTRACE_BENCH_SMALL_PAGES") != nullptr;
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
                       small_pages_ ? "mode=0755" : "mode=0755,huge=within_size") == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~RunDirOnTmpfs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  std::string what() const {
    if (mounted_) return small_pages_ ? "tmpfs (small pages)" : "tmpfs huge=within_size";
    return error_.empty() ? "on disk (HVTRACE_BENCH_RUN_ON_DISK)"
                          : "on disk (tmpfs: " + error_ + ")";
  }

 private:
  std::string dir_, error_;
  bool mounted_ = false, small_pages_ = false;
};

// j[key] as a number, -1 when |j| is no object or has no such number.
double Number(const json& j, const char* key) {
  if (!j.is_object()) return -1;
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : -1;
}

struct Run {
  double copied = 0, durable = 0, decoded = 0, committed = 0;
  double copy = 0, region_fsync = 0, decode = 0, write = 0, files = 0, qmp_delay = 0;
  double kaslr = 0, symbols = 0, names = 0, names_wait = 0, start = 0, copy_faults = 0;
  double copy_cpu = 0, copy_switches = 0, crash = 0, ring = 0;
  // The start's parts, ms from the panic: on the VM's strand, on a worker,
  // the capture directory made (-1: not in this build).
  double to_dispatch = -1, to_worker = -1, to_begun = -1;
  // The decode step's parts (-1: not in this build): its start, ms from the
  // panic; before the build (formats, metadata channel, BootKernels, of it
  // BootKernels: the map read and banners); the whole step.
  double to_decode = -1, prepare = -1, boot_kernels = -1, decode_step = -1;
  double vmcore_ms = -1, vmcore_mb = -1;  // vmcore = on-panic only.
  uint64_t trace_dat_bytes = 0, events = 0;
};

// One guest: boot, some trace events, panic, its capture's figures.
Result<Run> PanicOnce(const HvtracedProcess& daemon, const GuestImage& image, int i) {
  const std::string name = "lat-" + std::to_string(::getpid()) + "-" + std::to_string(i);
  auto guest = BootDaemonGuest(daemon, name, image.kernel, image.initrd);
  if (!guest.ok()) return guest.error();
  hostd::GuestConsole& console = *guest->console;
  if (!console.WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) {
    return Error{name + " did not become ready:\n" + ConsoleAndLog(*guest, daemon)};
  }
  // Some events besides the boot's own: markers and the work around them.
  const std::string marker = "/sys/kernel/tracing/instances/boot_map/trace_marker";
  auto ran = console.Run(
      "for i in $(seq 1 200); do echo lat-mark-$i > " + marker + "; ls /proc > /dev/null; done",
      kCommandTimeout);
  if (!ran.ok()) return Error{name + ": " + ran.error().message};
  if (Status s = console.Send("echo c > /proc/sysrq-trigger\n"); !s.ok()) return s.error();
  auto summary = daemon.WaitForCapture(name, "panic", 120s);
  if (!summary.ok()) return Error{name + ": " + summary.error().message};
  const std::string id = (*summary)["id"].get<std::string>();
  // The capture is listed once renamed into place; the daemon records its
  // time just after.
  json last = json::object();
  for (int tries = 0; tries < 100 && last.value("id", "") != id; ++tries) {
    auto status = daemon.Call("status", {{"name", name}});
    if (!status.ok()) return status.error();
    const json& l = (*status)["last_capture"];
    if (l.is_object()) last = l;
    if (last.value("id", "") != id) std::this_thread::sleep_for(50ms);
  }
  const fs::path dir = fs::path(daemon.captures_dir(name)) / id;
  const json m = json::parse(test_support::ReadText(dir / "manifest.json"), nullptr, false);
  if (!m.is_object()) return Error{dir.string() + "/manifest.json is not JSON"};
  if (const char* keep = std::getenv("HVTRACE_BENCH_KEEP"); keep != nullptr && *keep != 0) {
    std::error_code ec;
    fs::copy(dir, fs::path(keep) / name, fs::copy_options::recursive, ec);
    if (ec) std::fprintf(stderr, "HVTRACE_BENCH_KEEP: %s: %s\n", keep, ec.message().c_str());
  }
  const json& t = m["extra"]["timing_ms"];
  Run r;
  r.copied = Number(t, "trigger_to_region_durable");
  r.durable = Number(t, "trigger_to_recoverable");
  r.decoded = Number(t, "trigger_to_decoded");
  r.committed = last.value("id", "") == id ? Number(last, "trigger_to_disk_ms") : -1;
  r.copy = Number(t, "copy");
  r.region_fsync = Number(t, "region_write_fsync");
  r.decode = Number(t, "decode");
  r.write = Number(t, "trace_dat_write");
  r.files = Number(t, "trace_dat_files");
  const json pipeline = m["extra"].value("pipeline_ms", json::object());
  r.kaslr = Number(pipeline, "write_kaslr");
  r.symbols = Number(pipeline, "write_symbols");
  r.names = Number(pipeline, "write_names");
  r.names_wait = Number(pipeline, "write_names_wait");
  r.start = Number(t, "trigger_to_copy_start");
  const json queue = m["extra"].value("queue", json::object());
  r.to_dispatch = Number(queue, "trigger_to_dispatch_ms");
  r.to_worker = Number(queue, "trigger_to_worker_ms");
  r.to_begun = Number(t, "trigger_to_begun");
  r.to_decode = Number(t, "trigger_to_decode_start");
  r.prepare = Number(t, "decode_prepare");
  r.boot_kernels = Number(t, "decode_boot_kernels");
  r.decode_step = Number(t, "decode_step");
  // Inside decoded: the kernel log from the console events and the crash
  // summary (all boots); after it, the printk ring read from guest memory.
  r.crash = Number(pipeline, "write_kernel_log");
  r.ring = Number(t, "kernel_log");
  // Minor faults of the capture thread while it copied: how the range's
  // pages were mapped (one per 4 KiB page, or a few for large folios).
  r.copy_faults = Number(t, "copy_minor_faults");
  r.copy_cpu = Number(t, "copy_cpu");
  r.copy_switches = Number(t, "copy_involuntary_switches");
  if (const json vc = m["extra"].value("vmcore", json()); vc.is_object()) {
    r.vmcore_ms = Number(t, "vmcore");
    r.vmcore_mb = Number(vc, "bytes") / 1e6;
  }
  for (const json& f : m.value("files", json::array())) {
    const std::string file = f.is_object() ? f.value("name", "") : "";
    if (file.ends_with(".trace.dat"))
      r.trace_dat_bytes += static_cast<uint64_t>(Number(f, "bytes"));
  }
  r.events = static_cast<uint64_t>(std::max(0.0, Number(m.value("totals", json()), "events")));
  for (const json& e : m.value("qmp_events", json::array())) {
    if (!e.is_object() || e.value("event", "") != "GUEST_PANICKED") continue;
    const double qemu_us = Number(e.value("data", json()), "qemu_timestamp_us");
    const json host_time = m.value("host_time", json::object());
    const double got_us = Number(host_time.value("triggered", json()), "realtime_ns") / 1000.0;
    if (qemu_us > 0) r.qmp_delay = (got_us - qemu_us) / 1000.0;
  }
  (void)daemon.Call("stop", {{"name", name}});
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const std::string binary = argc > 2 ? argv[2] : "hvtraced";
  const std::string kernel = argc > 3 ? argv[3] : "6.12";
  // "vmcore": vmcore = on-panic, each capture also dumps the 1 GiB guest.
  const bool vmcore = argc > 4 && std::string(argv[4]) == "vmcore";
  if (std::string why = QemuUnavailableReason(); !why.empty()) {
    std::fprintf(stderr, "capture_latency: %s\n", why.c_str());
    return 2;
  }
  auto image = FindGuestImage(kernel);
  std::printf("# guest kernel %s (%s)\n", kernel.c_str(),
              image.ok() ? image->release.c_str() : "?");
  if (!image.ok()) {
    std::fprintf(stderr, "capture_latency: %s\n", image.error().message.c_str());
    return 1;
  }
  auto cache_root = hostd::DefaultCacheRoot();
  if (!cache_root.ok()) return 1;
  auto harvested = HarvestImage(*image, *cache_root);
  if (!harvested.ok()) {
    std::fprintf(stderr, "capture_latency: %s\n", harvested.error().message.c_str());
    return 1;
  }
  HvtracedProcess daemon({.tag = "lat",
                          .config = "vm_on_shutdown = stop\ncache_dir = " + cache_root->string() +
                                    "\n" + (vmcore ? "vmcore = on-panic\n" : ""),
                          .binary = binary});
  const RunDirOnTmpfs run_dir(daemon.dir() + "/run");
  if (Status s = daemon.Start(); !s.ok()) {
    std::fprintf(stderr, "capture_latency: %s\n", s.error().message.c_str());
    return 1;
  }
  std::printf("run dir (QEMU's memory files): %s\n", run_dir.what().c_str());
  std::printf("daemon %s; panic = its receipt of QMP GUEST_PANICKED; 16 MiB boot range, TCG%s\n",
              binary.c_str(), vmcore ? "; vmcore = on-panic (1 GiB guest)" : "");
  // Columns: ms from panic to region.bin fdatasynced, to it and its recovery
  // record durable, to the trace.dat files written, to the capture committed;
  // then ms of: the copy out of the guest's range (cp.cpu: the copying thread's CPU time in it;
  // cp.isw: the times it was preempted meanwhile), region write+fdatasync, decode, trace.dat step
  // (all), of it the files themselves, QEMU's event stamp to hvtraced's receipt. tdat.all splits
  // into kaslr, syms (kallsyms subset), n.wait (waiting for the task names after those) and
  // tdat.fil; names is the task names' own time, on a thread beside kaslr and syms (-1: a build
  // that found them in turn, its names column then part of tdat.all). crash: the kernel log from
  // the console events and the crash summary, part of tdat.all (the summary is ready at
  // "decoded"); ring: the printk ring read from guest memory (on a thread beside the decode once
  // it has the newest boot's KASLR offset) and its files;
  // vmcore, vc.MB: the dump-guest-memory step and the vmcore's size (-1: off).
  std::printf(
      "%3s %8s %8s %8s %8s | %7s %7s %7s %6s %7s %7s %7s %7s %7s %7s %7s %7s %7s %8s %9s %6s %6s "
      "%6s %7s %6s\n",
      "run", "reg.sync", "durable", "decoded", "commit", "start", "copy", "cp.cpu", "cp.isw",
      "reg.w+s", "decode", "tdat.all", "kaslr", "syms", "n.wait", "tdat.fil", "names", "qmp.lag",
      "cp.flt", "tdat.B", "events", "crash", "ring", "vmcore", "vc.MB");
  std::vector<double> copied, durable, decoded, committed, vmcore_ms, vmcore_mb;
  for (int i = 0; i < runs; ++i) {
    Result<Run> r = PanicOnce(daemon, *image, i);
    if (!r.ok()) {
      std::fprintf(stderr, "run %d: %s\n", i, r.error().message.c_str());
      return 1;
    }
    std::printf(
        "%3d %8.1f %8.1f %8.1f %8.1f | %7.1f %7.1f %7.1f %6.0f %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f "
        "%7.1f %7.1f %7.1f %8.0f %9llu %6llu %6.1f %6.1f %7.0f %6.1f\n",
        i, r->copied, r->durable, r->decoded, r->committed, r->start, r->copy, r->copy_cpu,
        r->copy_switches, r->region_fsync, r->decode, r->write, r->kaslr, r->symbols, r->names_wait,
        r->files, r->names, r->qmp_delay, r->copy_faults,
        static_cast<unsigned long long>(r->trace_dat_bytes),
        static_cast<unsigned long long>(r->events), r->crash, r->ring, r->vmcore_ms, r->vmcore_mb);
    std::printf("      start: on the VM's strand %.2f, on a worker %.2f, directory made %.2f ms\n",
                r->to_dispatch, r->to_worker, r->to_begun);
    std::printf(
        "      decode: starts at %.2f ms from the panic; before the build %.2f (BootKernels %.2f), "
        "whole step %.2f ms\n",
        r->to_decode, r->prepare, r->boot_kernels, r->decode_step);
    std::fflush(stdout);
    copied.push_back(r->copied);
    durable.push_back(r->durable);
    decoded.push_back(r->decoded);
    committed.push_back(r->committed);
    vmcore_ms.push_back(r->vmcore_ms);
    vmcore_mb.push_back(r->vmcore_mb);
  }
  const double limit = MemcpyMs(kRangeBytes);
  std::printf(
      "memcpy of 16 MiB (the limit, best of 20, cache-hot): %.2f ms; cold (median of 9, "
      "both ends out of the caches): %.2f ms\n",
      limit, ColdMemcpyMs(kRangeBytes));
  std::printf("%-40s %8s %8s %8s %14s\n", "ms from panic (-1: not in this build)", "min", "median",
              "max", "median/memcpy");
  for (const auto& [label, v] : {std::pair{"region.bin fdatasynced", &copied},
                                 std::pair{"region.bin + recovery record durable", &durable},
                                 std::pair{"trace.dat + crash summary (decoded)", &decoded},
                                 std::pair{"decoded capture committed", &committed}}) {
    const Stats s = Summarize(*v);
    std::printf("%-40s %8.1f %8.1f %8.1f %13.1fx\n", label, s.min, s.median, s.max,
                s.median / limit);
  }
  if (vmcore) {
    const Stats ms = Summarize(vmcore_ms), mb = Summarize(vmcore_mb);
    std::printf(
        "vmcore of the 1 GiB guest (dump-guest-memory kdump-zlib, durable): median %.0f ms "
        "(min %.0f, max %.0f), %.1f MB\n",
        ms.median, ms.min, ms.max, mb.median);
  }
  return 0;
}
