// Direct-write cost per event against its peers, in one run:
//   - plain stores: 32-byte records with rdtsc / clock_gettime time stamps
//     appended to a buffer (the physical limit of any write path),
//   - hvtrace direct-write (hvtrace/dwtrace.hpp): CLOCK_MONOTONIC, TSC, and
//     the default Clock::kAuto (TSC with an invariant TSC the kernel trusts
//     and clock-sync samples in the region, which this benchmark writes as
//     the agent does; CLOCK_MONOTONIC otherwise),
//   - LTTng-UST tracepoints with an active session (bench/dwtrace_bench.sh
//     starts lttng-sessiond and the session; run alone, LTTng is skipped),
//   - memcpy bandwidth (the floor for copying a region out after a panic),
// each with one thread and with one thread per CPU. Same payload everywhere:
// int, long and an 11-character string. Prints min/median ns per event over
// several repetitions and the LTTng/direct-write ratios; asserts nothing.
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "hvtrace/dwtrace.hpp"
#include "hvtrace/region_reader.h"
#include "hvtrace/region_writer.h"
#ifdef HVTRACE_HAVE_LTTNG
#include "lttng_peer.h"
#endif

namespace {

constexpr long kEvents = 1000000;
constexpr int kReps = 7;

struct Payload {
  int32_t step;
  int64_t value;
  char text[12];
};

struct Figure {
  double min_ns = 0, median_ns = 0;
};

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// CPU time of the calling thread: the machine is shared, and wall time would
// charge other processes' time slices to whichever path was running.
uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Runs |body(n)| on |threads| threads at once, |kReps| times; per repetition
// the cost is the slowest thread's CPU time / events per thread (what one
// writer pays while all write).
Figure Measure(int threads, const std::function<void(long)>& body) {
  std::vector<double> per_event;
  for (int rep = 0; rep < kReps; ++rep) {
    std::vector<std::thread> pool;
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<uint64_t> elapsed(threads);
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        body(1000);  // Warm up: binds a ring, faults pages in.
        ready++;
        while (!go.load()) {
        }
        const uint64_t start = ThreadCpuNs();
        body(kEvents);
        elapsed[t] = ThreadCpuNs() - start;
      });
    }
    while (ready.load() < threads) {
    }
    go = true;
    for (auto& th : pool) th.join();
    per_event.push_back(static_cast<double>(*std::max_element(elapsed.begin(), elapsed.end())) /
                        kEvents);
  }
  std::sort(per_event.begin(), per_event.end());
  return {per_event.front(), per_event[per_event.size() / 2]};
}

void Print(const char* name, int threads, const Figure& f) {
  std::printf("  %-44s %2d thr  min %7.1f ns  median %7.1f ns\n", name, threads, f.min_ns,
              f.median_ns);
}

// |n| 32-byte records stamped by |now| into a private 1 MiB buffer: what
// writing an event costs with nothing but the stores and the clock.
template <typename Now>
void PlainStores(long n, Now now) {
  static thread_local std::vector<uint64_t> buf(1 << 17);
  size_t at = 0;
  for (long i = 0; i < n; ++i) {
    uint64_t* r = &buf[at];
    r[0] = now();
    r[1] = static_cast<uint64_t>(i);
    r[2] = static_cast<uint64_t>(i) * 3;
    std::memcpy(&r[3], "hello wo", 8);
    at = (at + 4) & (buf.size() - 1);
    asm volatile("" ::"r"(r) : "memory");
  }
}

}  // namespace

int main() {
  std::printf("times are per-thread CPU time (the host is shared; load average matters less)\n");
  const int cpus = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  // A region as hostd would create it, in shared memory as the BAR is.
  const uint64_t size = 16 << 20;
  void* mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 1;
  auto* base = static_cast<std::byte*>(mem);
  hvtrace::RegionPlanOptions opt;
  opt.max_cpus = static_cast<uint32_t>(cpus);
  opt.dw_rings = static_cast<uint32_t>(2 * cpus + 2);
  opt.dw_slots = 64;
  auto g = hvtrace::PlanRegion(size, opt);
  if (!g.ok() || !hvtrace::InitRegionHeader({base, size}, *g, 0).ok()) {
    std::fprintf(stderr, "region setup failed\n");
    return 1;
  }
  auto guest = hvtrace::GuestRegion::Attach(base, size);
  hvtrace::region::GuestIdentity id{};
  id.boot_generation = 1;
  id.nr_cpus = static_cast<uint32_t>(cpus);
  // Clock-sync samples as the agent writes them before it announces the
  // guest (what lets Clock::kAuto choose the TSC).
  for (int i = 0; i < 2; ++i) {
    const uint64_t t0 = __rdtsc();
    const uint64_t m = NowNs();
    const uint64_t t1 = __rdtsc();
    guest->AddClockSync(m, 0, 0, t0 + (t1 - t0) / 2);
    if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  guest->WriteIdentity(id);
  auto mono = hvtrace::dw::Tracer::FromMemory(base, size, hvtrace::dw::Clock::kMonotonic);
  if (!mono.ok()) {
    std::fprintf(stderr, "%s\n", mono.error().message.c_str());
    return 1;
  }
  const std::vector<hvtrace::dw::Field> fields = {
      {"step", "int", offsetof(Payload, step), 4, true},
      {"value", "long", offsetof(Payload, value), 8, true},
      {"text", "char[12]", offsetof(Payload, text), 12, false}};
  auto ev = (*mono)->Register("bench", "event", fields);
  if (!ev.ok()) return 1;
  const uint16_t event_id = *ev;
  hvtrace::dw::Tracer* tracer_mono = mono->get();

  std::printf(
      "dwtrace_bench: %ld events x %d reps per figure, %d CPUs, payload int+long+char[12]\n",
      kEvents, kReps, cpus);
  std::vector<std::pair<int, Figure>> dw_mono, dw_tsc, dw_auto, lttng, limit;
  auto automatic = hvtrace::dw::Tracer::FromMemory(base, size, hvtrace::dw::Clock::kAuto);
  if (!automatic.ok()) return 1;
  const bool auto_tsc = (*automatic)->clock() == hvtrace::dw::Clock::kTsc;
  const char* auto_name = auto_tsc ? "TSC" : "CLOCK_MONOTONIC";
  for (int threads : {1, cpus}) {
    std::printf("%d thread(s):\n", threads);
    // The limit: plain stores of 32-byte records into a private 1 MiB buffer.
    Figure plain = Measure(threads, [](long n) { PlainStores(n, [] { return __rdtsc(); }); });
    Print("plain stores + rdtsc (limit)", threads, plain);
    limit.push_back({threads, plain});
    Print("plain stores + clock_gettime(MONOTONIC)", threads,
          Measure(threads, [](long n) { PlainStores(n, NowNs); }));
    Figure f = Measure(threads, [&](long n) {
      Payload p{0, 0, "hello world"};
      for (long i = 0; i < n; ++i) {
        p.step = static_cast<int32_t>(i);
        p.value = i * 3;
        tracer_mono->Write(event_id, &p, sizeof(p));
      }
    });
    Print("hvtrace direct-write (CLOCK_MONOTONIC)", threads, f);
    dw_mono.push_back({threads, f});
    {
      auto tsc = hvtrace::dw::Tracer::FromMemory(base, size, hvtrace::dw::Clock::kTsc);
      hvtrace::dw::Tracer* t = tsc->get();
      f = Measure(threads, [&](long n) {
        Payload p{0, 0, "hello world"};
        for (long i = 0; i < n; ++i) {
          p.step = static_cast<int32_t>(i);
          p.value = i * 3;
          t->Write(event_id, &p, sizeof(p));
        }
      });
      Print("hvtrace direct-write (TSC)", threads, f);
      dw_tsc.push_back({threads, f});
    }
    {
      hvtrace::dw::Tracer* t = automatic->get();
      f = Measure(threads, [&](long n) {
        Payload p{0, 0, "hello world"};
        for (long i = 0; i < n; ++i) {
          p.step = static_cast<int32_t>(i);
          p.value = i * 3;
          t->Write(event_id, &p, sizeof(p));
        }
      });
      Print(auto_tsc ? "hvtrace direct-write (Clock::kAuto = TSC)"
                     : "hvtrace direct-write (Clock::kAuto = CLOCK_MONOTONIC)",
            threads, f);
      dw_auto.push_back({threads, f});
    }
#ifdef HVTRACE_HAVE_LTTNG
    if (LttngEnabled()) {
      f = Measure(threads, [](long n) { LttngFire(n); });
      Print("LTTng-UST tracepoint, active session", threads, f);
      lttng.push_back({threads, f});
    } else {
      std::printf(
          "  LTTng-UST: no active session has hvtrace_bench:event enabled (run "
          "bench/dwtrace_bench.sh)\n");
    }
#else
    std::printf("  LTTng-UST: not built (liblttng-ust-dev missing)\n");
#endif
  }
  // memcpy: the floor for copying a region out after a panic.
  {
    std::vector<std::byte> dst(size);
    double best = 1e30;
    for (int rep = 0; rep < kReps; ++rep) {
      const uint64_t start = NowNs();
      std::memcpy(dst.data(), base, size);
      asm volatile("" ::"r"(dst.data()) : "memory");
      best = std::min(best, static_cast<double>(NowNs() - start));
    }
    std::printf("memcpy of the 16 MiB region: %.2f ms (%.1f GB/s)\n", best / 1e6, size / best);
  }
  // Check that what was written is really there (a benchmark of nothing would be fast too).
  std::vector<std::byte> copy;
  hvtrace::CopyLiveRegion(base, *g, &copy);
  auto snap = hvtrace::ReadRegion(std::move(copy), *g);
  uint64_t records = 0;
  if (snap.ok()) {
    for (const auto& ring : snap->dw_rings) {
      for (const auto& page : ring.pages) records += page.records;
    }
    std::printf("region check: %llu direct-write records readable in the region, %llu issues\n",
                static_cast<unsigned long long>(records),
                static_cast<unsigned long long>(snap->issue_total()));
  }
  // What a program gets without choosing: Clock::kAuto, and why.
  std::printf(
      "default clock (Clock::kAuto): %s; this CPU's TSC is %s, the kernel %s it "
      "(available_clocksource), the region holds clock-sync samples\n",
      auto_name, hvtrace::dw::HasInvariantTsc() ? "invariant" : "not invariant",
      hvtrace::dw::KernelTrustsTsc() ? "trusts" : "does not trust");
  for (size_t i = 0; i < limit.size() && i < dw_tsc.size(); ++i) {
    std::printf(
        "RATIO %d thread(s): direct-write/limit (plain stores + rdtsc) median = %.2f (TSC), %.2f "
        "(Clock::kAuto = %s); goal <= 1.5\n",
        limit[i].first, dw_tsc[i].second.median_ns / limit[i].second.median_ns,
        dw_auto[i].second.median_ns / limit[i].second.median_ns, auto_name);
  }
  for (size_t i = 0; i < lttng.size() && i < dw_mono.size(); ++i) {
    const double mono_ratio = dw_mono[i].second.median_ns / lttng[i].second.median_ns;
    const double tsc_ratio = dw_tsc[i].second.median_ns / lttng[i].second.median_ns;
    const double auto_ratio = dw_auto[i].second.median_ns / lttng[i].second.median_ns;
    std::printf(
        "RATIO %d thread(s): direct-write/LTTng-UST median = %.3f (MONOTONIC), %.3f (TSC), %.3f "
        "(Clock::kAuto = %s); goal <= 0.15\n",
        lttng[i].first, mono_ratio, tsc_ratio, auto_ratio, auto_name);
  }
  munmap(mem, size);
  return 0;
}
