#include "dw_write.h"

#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "hvtrace/dwtrace.hpp"

namespace hvtrace::guest_test {
namespace {

struct Marker {
  uint32_t seq;
  char text[64];
};

uint64_t MonoMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

}  // namespace

// One event "TEXT n" per call, or with --for-ms one every --every-ms for
// that long, across the host going away and coming back (the tracer drops
// and counts while no region is there, then follows the new one).
int DwWriteMain(int argc, char** argv) {
  std::string region, text, stop_file;
  uint64_t count = 1, for_ms = 0, every_ms = 10;
  dw::Clock clock = dw::Clock::kAuto;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--region" && i + 1 < argc)
      region = argv[++i];
    else if (arg == "--count" && i + 1 < argc)
      count = std::strtoull(argv[++i], nullptr, 10);
    else if (arg == "--for-ms" && i + 1 < argc)
      for_ms = std::strtoull(argv[++i], nullptr, 10);
    else if (arg == "--every-ms" && i + 1 < argc)
      every_ms = std::strtoull(argv[++i], nullptr, 10);
    else if (arg == "--stop-file" && i + 1 < argc)
      stop_file = argv[++i];
    else if (arg == "--mono")
      clock = dw::Clock::kMonotonic;
    else if (arg == "--tsc")
      clock = dw::Clock::kTsc;
    else
      text = arg;
  }
  auto tracer = dw::Tracer::Open(region, clock);
  if (!tracer.ok()) {
    std::fprintf(stderr, "dw-write: %s\n", tracer.error().message.c_str());
    return 1;
  }
  auto id = (*tracer)->Register("hvtrace_dw", "marker",
                                {{"seq", "unsigned int", offsetof(Marker, seq), 4, false},
                                 {"text", "char[64]", offsetof(Marker, text), 64, false}},
                                "\"seq=%u text=%s\", REC->seq, REC->text");
  if (!id.ok()) {
    std::fprintf(stderr, "dw-write: %s\n", id.error().message.c_str());
    return 1;
  }
  const uint64_t end_ms = MonoMs() + for_ms;
  const bool timed = for_ms > 0;
  uint64_t written = 0, n = 0;
  for (; timed ? MonoMs() < end_ms && (stop_file.empty() || access(stop_file.c_str(), F_OK) != 0)
               : n < count;
       ++n) {
    Marker m{};
    m.seq = static_cast<uint32_t>(n);
    std::snprintf(m.text, sizeof(m.text), (count > 1 || timed) ? "%s %llu" : "%s", text.c_str(),
                  static_cast<unsigned long long>(n));
    written += (*tracer)->Write(*id, &m, sizeof(m)) ? 1 : 0;
    if (timed) {
      const timespec pause{static_cast<time_t>(every_ms / 1000),
                           static_cast<long>(every_ms % 1000) * 1000000};
      nanosleep(&pause, nullptr);
    }
  }
  std::printf(
      "dw-write: id %u, %llu/%llu events written, generation %u, clock %s, dropped detached %llu, "
      "reattaches %llu, bus faults %llu\n",
      *id, static_cast<unsigned long long>(written), static_cast<unsigned long long>(n),
      (*tracer)->boot_generation(), (*tracer)->clock() == dw::Clock::kTsc ? "tsc" : "mono",
      static_cast<unsigned long long>((*tracer)->dropped_detached()),
      static_cast<unsigned long long>((*tracer)->reattaches()),
      static_cast<unsigned long long>(RegionBusFaults()));
  return timed || written == n ? 0 : 1;
}

}  // namespace hvtrace::guest_test
