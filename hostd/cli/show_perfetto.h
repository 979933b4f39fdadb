// hvtrace show CAPTURE --format perfetto -o FILE [--boot N] [--timeline]:
// the capture as one Perfetto trace (hvtrace/perfetto_writer.h says what it
// holds; docs/cli.md the mapping and the clocks).
//
// Without --timeline every boot's trace.dat (or boot N's) is a sequence of
// the guest machine on its own trace clock, a kexec'd boot placed after the
// one before. With --timeline the guest's boots are their host-clock files
// (boot-<n>.host-clock.dat: placed on the host's CLOCK_REALTIME through the
// fitted line) and host.dat is a second machine, "host (QEMU)", on the same
// clock.
//
// The file is written as FILE.tmp and renamed to FILE only when every
// selected file was read and the output written: a capture that cannot be
// read never leaves a half-written FILE behind.
#ifndef HVTRACE_HOSTD_CLI_SHOW_PERFETTO_H_
#define HVTRACE_HOSTD_CLI_SHOW_PERFETTO_H_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hvtrace {
class PerfettoTraceWriter;
}

namespace hvtrace::cli {

struct PerfettoExport {
  std::filesystem::path dir;
  nlohmann::json manifest;  // {} when the capture has none readable.
  // The boot files of |dir| by boot number (show's BootFiles); not used
  // with |timeline|.
  std::vector<std::pair<uint32_t, std::filesystem::path>> boots;
  std::optional<uint32_t> boot;
  bool timeline = false;
  std::string output;  // The file to write (not "-").
};

// Writes the trace. Exit status as `hvtrace show`.
int ShowPerfetto(const PerfettoExport& request);

// The crash summary (the manifest's "crash" object, when it has one and it
// is about |boot|) as an instant event on the sequence just written, at the
// crash's time. True when one was written.
bool AddCrashInstant(const nlohmann::json& manifest, uint32_t boot, PerfettoTraceWriter& writer);

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_SHOW_PERFETTO_H_
