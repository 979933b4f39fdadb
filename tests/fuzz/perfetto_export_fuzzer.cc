// Fuzzes `hvtrace show --format perfetto`'s exporter: any bytes as a boot's
// trace.dat (a decoded capture whose formats, records and payloads are
// hostile), exported as a guest boot; the output must then parse as a
// Perfetto trace with the tests' own reader, holding no more events than
// the file had records. Seeds: tests/fixtures/fuzz/perfetto_export/ (the
// trace.dat seeds).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "../unit/shared/decode/perfetto_reader.h"
#include "hvtrace/perfetto_writer.h"

namespace {

// |fd|'s whole content.
std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int in = ::memfd_create("fuzz.dat", MFD_CLOEXEC);
  const int out = ::memfd_create("fuzz.pftrace", MFD_CLOEXEC);
  if (in < 0 || out < 0) __builtin_trap();
  if (size != 0 && ::write(in, data, size) != static_cast<ssize_t>(size)) __builtin_trap();
  const std::string path = "/proc/self/fd/" + std::to_string(in);
  hvtrace::PerfettoCounts counts;
  uint64_t records = 0;
  {
    hvtrace::PerfettoTraceWriter writer(out);
    writer.WriteSystemInfo("6.12.0", 2, "fuzz");
    auto stats = writer.WriteGuestFile(path, {.name = "fuzz boot 0"}, &counts);
    if (stats.ok()) records = stats->events;
    writer.WriteInstant(0, "crash", "\xff\xfe not UTF-8");
    if (!writer.Finish().ok()) __builtin_trap();
  }
  const hvtrace::test::ReadTrace t = hvtrace::test::ReadPerfettoTrace(ReadAll(out));
  if (!t.ok || !t.system_info_first) __builtin_trap();
  if (t.events.size() != counts.events || counts.events != records) __builtin_trap();
  ::close(in);
  ::close(out);
  return 0;
}
