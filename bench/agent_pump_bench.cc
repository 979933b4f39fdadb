// hvtrace-agent pump throughput on this machine's real kernel tracefs.
//
// The agent's own loop (Agent::Run: poll on the per-CPU trace_pipe_raw
// files, pushes at least every pump interval) runs against a private tracefs
// instance (instances/hvtrace-pump-bench-PID, removed afterwards, so the
// machine's top-level tracing is untouched) and a region file in /dev/shm,
// while a child process makes a tracepoint-heavy load: getppid() in a loop
// with syscalls:sys_enter_getppid and sys_exit_getppid enabled (two events
// per call). Prints pages/s, MB/s, events lost to the kernel ring, and the
// agent's CPU time per page (getrusage of the agent's thread). Asserts
// nothing.
//
//   agent_pump_bench [SECONDS=5] [PUMP_INTERVAL_MS=50] [REGION_MIB=64]
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "agent.h"
#include "hvtrace/region_reader.h"
#include "hvtrace/region_writer.h"

namespace {

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

double RusageSeconds(const timeval& tv) {
  return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6;
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 5.0;
  const uint32_t interval_ms = argc > 2 ? static_cast<uint32_t>(std::atoi(argv[2])) : 50;
  const uint64_t region_mib = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 64;
  const std::string tracing = "/sys/kernel/tracing";
  const std::string instance_name = "hvtrace-pump-bench-" + std::to_string(getpid());
  const std::string instance = tracing + "/instances/" + instance_name;
  if (mkdir(instance.c_str(), 0755) != 0) {
    std::fprintf(stderr, "agent_pump_bench: cannot create %s: %s (needs root and tracefs)\n",
                 instance.c_str(), std::strerror(errno));
    return 1;
  }
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  const std::string region_path = "/dev/shm/hvtrace-pump-bench-" + std::to_string(getpid());
  int status = 1;
  {
    // The region, as hostd creates it.
    hvtrace::RegionPlanOptions opt;
    opt.max_cpus = static_cast<uint32_t>(cpus);
    opt.region_id = 0x9b3c4;
    const uint64_t size = region_mib << 20;
    auto g = hvtrace::PlanRegion(size, opt);
    if (!g.ok()) {
      std::fprintf(stderr, "agent_pump_bench: %s\n", g.error().message.c_str());
      rmdir(instance.c_str());
      return 1;
    }
    std::vector<std::byte> mem(size);
    (void)hvtrace::InitRegionHeader(mem, *g, 1);
    auto* req = reinterpret_cast<hvtrace::region::HostRequests*>(
        mem.data() + hvtrace::region::kHostRequestsOffset);
    const std::string events = "syscalls:sys_enter_getppid,syscalls:sys_exit_getppid";
    std::memcpy(req->events, events.data(), events.size());
    req->events_len = static_cast<uint32_t>(events.size());
    req->pump_interval_ms = interval_ms;
    req->request_seq = 1;
    {
      std::ofstream out(region_path, std::ios::binary);
      out.write(reinterpret_cast<const char*>(mem.data()),
                static_cast<std::streamsize>(mem.size()));
    }
    auto host = hvtrace::RegionMapping::Map(region_path);
    WriteFile(instance + "/buffer_size_kb", "4096");

    // The load, in a child, started once the agent has enabled the events.
    const pid_t child = fork();
    if (child == 0) {
      usleep(300000);
      const uint64_t end = NowNs() + static_cast<uint64_t>(seconds * 1e9);
      uint64_t calls = 0;
      while (NowNs() < end) {
        for (int i = 0; i < 1000; ++i) syscall(SYS_getppid);
        calls += 1000;
      }
      std::printf("load: %llu getppid() calls (%.0f/s, %llu events)\n",
                  static_cast<unsigned long long>(calls), static_cast<double>(calls) / seconds,
                  static_cast<unsigned long long>(2 * calls));
      std::fflush(stdout);
      _exit(0);
    }

    // The agent may raise the global saved_cmdlines_size on an idle
    // machine; the bench puts it back afterwards.
    std::string cmdlines_size;
    std::getline(std::ifstream(tracing + "/saved_cmdlines_size"), cmdlines_size);
    hvtrace::agent::AgentOptions options;
    options.tracefs = tracing;
    options.instance = instance_name;
    options.region_path = region_path;
    options.pointer_file = "";
    options.set_mono_clock = false;
    options.run_for_ms = static_cast<uint64_t>(seconds * 1000) + 600;
    hvtrace::agent::Agent agent(options);
    rusage before{}, after{};
    getrusage(RUSAGE_THREAD, &before);
    const uint64_t t0 = NowNs();
    status = agent.Run();
    const double wall = static_cast<double>(NowNs() - t0) / 1e9;
    getrusage(RUSAGE_THREAD, &after);
    waitpid(child, nullptr, 0);
    std::string now_size;
    std::getline(std::ifstream(tracing + "/saved_cmdlines_size"), now_size);
    if (!cmdlines_size.empty() && now_size != cmdlines_size)
      WriteFile(tracing + "/saved_cmdlines_size", cmdlines_size);

    if (host.ok()) {
      const auto* st = reinterpret_cast<const hvtrace::region::GuestStatus*>(
          host->data() + hvtrace::region::kGuestStatusOffset);
      uint64_t lost = 0, overrun = 0;
      for (uint32_t c = 0; c < g->max_cpus; ++c) {
        const auto* ring = reinterpret_cast<const hvtrace::region::CpuRingHeader*>(
            host->data() + g->CpuRingOffset(c));
        lost += ring->lost_events;
        overrun += ring->overrun;
      }
      const double user = RusageSeconds(after.ru_utime) - RusageSeconds(before.ru_utime);
      const double sys = RusageSeconds(after.ru_stime) - RusageSeconds(before.ru_stime);
      const double pages = static_cast<double>(st->pages_pushed);
      std::printf(
          "pump: %.0f pages in %.2f s = %.0f pages/s (%.1f MB/s), pump interval %u ms, %ld CPUs\n",
          pages, wall, pages / wall, pages * 4096 / wall / 1e6, interval_ms, cpus);
      std::printf("agent CPU: user %.3f s + sys %.3f s = %.1f%% of one CPU; %.2f us per page\n",
                  user, sys, 100.0 * (user + sys) / wall,
                  pages > 0 ? (user + sys) * 1e6 / pages : 0.0);
      std::printf(
          "kernel ring: %llu events lost (missed in pages), overrun %llu; loss window %.1f ms\n",
          static_cast<unsigned long long>(lost), static_cast<unsigned long long>(overrun),
          static_cast<double>(st->max_push_gap_ns) / 1e6);
      // What was pushed is really there (the newest slots_per_cpu pages of
      // each CPU; older ones were overwritten by the ring, as designed).
      std::vector<std::byte> copy;
      hvtrace::CopyLiveRegion(host->data(), *g, &copy);
      auto snap = hvtrace::ReadRegion(std::move(copy), *g);
      if (snap.ok()) {
        uint64_t pages_kept = 0, records = 0;
        for (const auto& ring : snap->cpus) {
          for (const auto& page : ring.pages) records += page.records;
          pages_kept += ring.pages.size();
        }
        std::printf(
            "region check: %llu pages readable (ring capacity %u per CPU), %llu events, %llu "
            "issues\n",
            static_cast<unsigned long long>(pages_kept), g->slots_per_cpu,
            static_cast<unsigned long long>(records),
            static_cast<unsigned long long>(snap->issue_total()));
      }
    }
  }
  unlink(region_path.c_str());
  if (rmdir(instance.c_str()) != 0) {
    std::fprintf(stderr, "agent_pump_bench: could not remove %s: %s\n", instance.c_str(),
                 std::strerror(errno));
  }
  return status;
}
