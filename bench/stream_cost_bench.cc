// What one `hvtrace stream` costs hvtraced, in process: a 16 MiB region
// planned as hvtraced plans one for a 2-vCPU guest, its CPU rings full of
// pages (a guest that ran a while), direct-write threads writing events at a
// fixed rate, and a reader doing the daemon's stream tick every 50 ms
// (read the region, RegionStreamer::Feed) after the agent's push stamp,
// as the agent's 50 ms pump sets it. The reader's own CPU time
// (CLOCK_THREAD_CPUTIME_ID) per second of run is the figure, for:
//   - incremental: IncrementalRegionReader::Read, what the daemon does now;
//   - full: CopyLiveRegion + ReadRegion of the whole region, what it did;
//   - memcpy limit: copying just the bytes the guest wrote, in 50 ms chunks.
// bench/stream_cost.sh runs this and the real-guest measurement.
//   stream_cost_bench [seconds per figure, default 5]
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "hvtrace/dwtrace.hpp"
#include "hvtrace/region_incremental.h"
#include "hvtrace/region_reader.h"
#include "hvtrace/region_writer.h"
#include "region_stream.h"

namespace {

using hvtrace::RegionGeometry;
using Clock = std::chrono::steady_clock;

constexpr auto kTick = std::chrono::milliseconds(50);  // kStreamPollInterval
constexpr int kWriters = 4;        // A ring holds 32 KiB: 1 MB/s needs several per 50 ms.
constexpr uint32_t kPayload = 56;  // Bytes per event payload (+ 8 header = 64 per record).

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000 + static_cast<uint64_t>(ts.tv_nsec);
}

struct Region {
  RegionGeometry geometry;
  std::vector<std::byte> mem;
};

Region MakeRegion() {
  Region r;
  hvtrace::RegionPlanOptions opt;
  opt.max_cpus = 2;
  opt.region_id = 16;
  auto g = hvtrace::PlanRegion(16 << 20, opt);
  if (!g.ok()) std::abort();
  r.geometry = *g;
  r.mem.assign(g->region_size, std::byte{0});
  if (!hvtrace::InitRegionHeader(r.mem, *g, 1).ok()) std::abort();
  auto guest = hvtrace::GuestRegion::Attach(r.mem.data(), r.mem.size());
  if (!guest.ok()) std::abort();
  hvtrace::region::GuestIdentity id{};
  id.boot_generation = 1;
  id.nr_cpus = 2;
  id.page_size = 4096;
  id.trace_clock = hvtrace::region::kClockMono;
  std::strcpy(id.kernel_release, "6.12.0-bench");
  guest->WriteIdentity(id);
  guest->status()->state = hvtrace::region::kStateRunning;
  // Fill both CPU rings with full pages, as a guest that traced a while
  // leaves them: a full read walks every one on every tick.
  auto tracer = hvtrace::dw::Tracer::FromMemory(r.mem.data(), r.mem.size());
  if (!tracer.ok()) std::abort();
  auto ev = (*tracer)->Register("bench", "fill", {{"n", "int", 0, 4, true}});
  if (!ev.ok()) std::abort();
  for (int i = 0; i < 60; ++i) (*tracer)->Write(*ev, &i, sizeof i);
  std::vector<std::byte> page(g->slot_size);
  std::memcpy(page.data(), guest->dw_page(0, 0), page.size());
  for (uint32_t cpu = 0; cpu < 2; ++cpu) {
    for (uint32_t s = 0; s < g->slots_per_cpu; ++s) guest->PushCpuPage(cpu, 1, page, 0);
  }
  return r;
}

struct Figure {
  double first_ms = 0;    // The first tick: the whole region, once per stream.
  double cpu_per_s = 0;   // Reader CPU seconds per second of run, after the first tick.
  double read_per_s = 0;  // Of which reading the region (the rest: the streamer's decoding).
  uint64_t events = 0;    // Streamed out.
  uint64_t written = 0;   // Events the writers wrote.
  uint64_t bytes_copied = 0;
};

// Writers at |rate| bytes/s in total, paced per millisecond.
Figure Run(uint64_t rate, int seconds, bool incremental) {
  Region r = MakeRegion();
  auto tracer =
      hvtrace::dw::Tracer::FromMemory(r.mem.data(), r.mem.size(), hvtrace::dw::Clock::kMonotonic);
  if (!tracer.ok()) std::abort();
  std::vector<hvtrace::dw::Field> fields = {{"n", "u64", 0, 8, false},
                                            {"pad", "char[48]", 8, 48, false}};
  auto ev = (*tracer)->Register("bench", "event", fields);
  if (!ev.ok()) std::abort();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> written{0};
  std::vector<std::thread> writers;
  if (rate > 0) {
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back([&] {
        const double per_ms = static_cast<double>(rate) / kWriters / 1000.0 / (kPayload + 8);
        double owed = 0;
        char payload[kPayload] = {};
        uint64_t n = 0;
        auto next = Clock::now();
        while (!stop.load(std::memory_order_relaxed)) {
          owed += per_ms;
          for (; owed >= 1; owed -= 1) {
            std::memcpy(payload, &n, sizeof n);
            ++n;
            if ((*tracer)->Write(*ev, payload, kPayload)) written.fetch_add(1);
          }
          next += std::chrono::milliseconds(1);
          std::this_thread::sleep_until(next);
        }
      });
    }
  }
  hvtrace::hostd::RegionStreamer streamer(r.geometry,
                                          {false, false, std::chrono::milliseconds(1000)});
  auto reader = hvtrace::IncrementalRegionReader::Create(r.geometry);
  if (!reader.ok()) std::abort();
  auto guest = hvtrace::GuestRegion::Attach(r.mem.data(), r.mem.size());
  if (!guest.ok()) std::abort();
  hvtrace::region::GuestStatus* status = guest->status();
  Figure f;
  const int ticks = seconds * 20;
  double cpu0 = ThreadCpuSeconds();
  const double start = cpu0;
  auto next = Clock::now();
  for (int t = 0; t <= ticks; ++t) {
    if (t == 1) {
      cpu0 = ThreadCpuSeconds();
      f.first_ms = (cpu0 - start) * 1000;
    }
    const bool flush = t == ticks;
    if (flush) {
      stop = true;
      for (auto& w : writers) w.join();
    }
    // The agent's pump: it stamps every push (each 50 ms by default), and
    // the streamer releases events up to the push before the last one.
    status->last_push_mono_ns = MonotonicNs();
    hvtrace::hostd::RegionStreamer::Output out;
    if (incremental) {
      const double read0 = ThreadCpuSeconds();
      hvtrace::RegionSnapshot* snap = (*reader)->Read(r.mem.data());
      if (t > 0) f.read_per_s += ThreadCpuSeconds() - read0;
      out = streamer.Feed(snap, Clock::now(), flush);
      f.bytes_copied += (*reader)->bytes_copied();
    } else {
      std::vector<std::byte> copy;
      hvtrace::CopyLiveRegion(r.mem.data(), r.geometry, &copy);
      auto snap = hvtrace::ReadRegion(std::move(copy), r.geometry);
      if (!snap.ok()) std::abort();
      out = streamer.Feed(&*snap, Clock::now(), flush);
      f.bytes_copied += r.geometry.region_size;
    }
    f.events += out.events;
    if (t == 0) f.bytes_copied = 0;
    next += kTick;
    std::this_thread::sleep_until(next);
  }
  const double run_s = ticks * std::chrono::duration<double>(kTick).count();
  f.cpu_per_s = (ThreadCpuSeconds() - cpu0) / run_s;
  f.read_per_s /= run_s;
  f.written = written.load();
  return f;
}

// The limit: memcpy of the bytes the guest wrote, one chunk per tick.
double MemcpyLimit(uint64_t rate, int seconds) {
  if (rate == 0) return 0;
  const size_t chunk = rate / 20;
  std::vector<std::byte> from(chunk, std::byte{1}), to(chunk);
  const double cpu0 = ThreadCpuSeconds();
  for (int t = 0; t < seconds * 20; ++t) {
    from[static_cast<size_t>(t) % chunk] = std::byte(t);
    std::memcpy(to.data(), from.data(), chunk);
    __asm__ __volatile__("" : : "r"(to.data()) : "memory");
  }
  return (ThreadCpuSeconds() - cpu0) / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const int seconds = argc > 1 ? std::atoi(argv[1]) : 5;
  if (argc > 2) {  // "profile RATE": the incremental tick alone, for perf.
    const Figure f = Run(std::strtoull(argv[2], nullptr, 10), seconds, true);
    std::printf("incremental %.3f%%\n", f.cpu_per_s * 100);
    return 0;
  }
  std::printf(
      "in-process stream tick, 16 MiB region, 2 CPU rings full, %d dw writer threads, "
      "%u-byte events, %d s per figure\n",
      kWriters, kPayload + 8, seconds);
  std::printf("%-10s %14s %12s %14s %14s %10s %12s %12s %14s %12s\n", "rate", "incremental",
              "(its read)", "full(old)", "memcpy-limit", "full/incr", "incr/limit", "events",
              "copied/tick", "first tick");
  for (uint64_t rate : {uint64_t{0}, uint64_t{100'000}, uint64_t{1'000'000}}) {
    const Figure inc = Run(rate, seconds, true);
    const Figure full = Run(rate, seconds, false);
    const double limit = MemcpyLimit(rate, seconds);
    const std::string name = rate == 0 ? "idle" : std::to_string(rate / 1000) + " KB/s";
    std::printf(
        "%-10s %12.3f%% %10.3f%% %12.3f%% %12.4f%% %9.0fx %11s %6llu/%-6llu %12llu %9.1f ms\n",
        name.c_str(), inc.cpu_per_s * 100, inc.read_per_s * 100, full.cpu_per_s * 100, limit * 100,
        inc.cpu_per_s > 0 ? full.cpu_per_s / inc.cpu_per_s : 0.0,
        limit > 0 ? (std::to_string(static_cast<int>(inc.cpu_per_s / limit)) + "x").c_str() : "-",
        static_cast<unsigned long long>(inc.events), static_cast<unsigned long long>(inc.written),
        static_cast<unsigned long long>(inc.bytes_copied / (seconds * 20)), inc.first_ms);
  }
  std::printf(
      "(%% = CPU time of the tick's thread per second, after its first tick: %% of one "
      "core; (its read) = IncrementalRegionReader::Read alone, the rest is the streamer "
      "decoding and formatting events; first tick = the stream's first read, which takes "
      "the whole region once)\n");
  return 0;
}
