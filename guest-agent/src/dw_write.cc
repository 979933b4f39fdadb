#include "dw_write.h"

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "hvtrace/dwtrace.hpp"

namespace hvtrace::agent {
namespace {

struct Marker {
  uint32_t seq;
  char text[64];
};

}  // namespace

int DwWriteMain(int argc, char** argv) {
  std::string region, text;
  uint64_t count = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--region" && i + 1 < argc) region = argv[++i];
    else if (arg == "--count" && i + 1 < argc) count = std::strtoull(argv[++i], nullptr, 10);
    else text = arg;
  }
  auto tracer = dw::Tracer::Open(region);
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
  uint64_t written = 0;
  for (uint64_t n = 0; n < count; ++n) {
    Marker m{};
    m.seq = static_cast<uint32_t>(n);
    std::snprintf(m.text, sizeof(m.text), count > 1 ? "%s %llu" : "%s", text.c_str(),
                  static_cast<unsigned long long>(n));
    written += (*tracer)->Write(*id, &m, sizeof(m)) ? 1 : 0;
  }
  std::printf("dw-write: id %u, %llu/%llu events written, generation %u\n", *id,
              static_cast<unsigned long long>(written), static_cast<unsigned long long>(count),
              (*tracer)->boot_generation());
  return written == count ? 0 : 1;
}

}  // namespace hvtrace::agent
