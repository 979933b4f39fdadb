// hvtrace-agent: see agent.h. "hvtrace-agent dw-write TEXT" writes TEXT as
// direct-write events (a test and demo client of hvtrace/dwtrace.hpp);
// "hvtrace-agent scribble MODE" damages the region on purpose (scribble.h).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "agent.h"
#include "dw_write.h"
#include "scribble.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: hvtrace-agent [--region PATH] [--tracefs DIR] [--sysfs DIR] [--keep-clock]\n"
               "                     [--run-for MS] [-v]\n"
               "       hvtrace-agent dw-write [--region PATH] [--count N | --for-ms MS [--every-ms MS]\n"
               "                              [--stop-file PATH]]\n"
               "                              [--mono|--tsc] TEXT\n"
               "       hvtrace-agent scribble [--region PATH] [--repeat-ms MS] MODE...   (a hostile guest)\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "dw-write") == 0) return hvtrace::agent::DwWriteMain(argc - 1, argv + 1);
  if (argc > 1 && std::strcmp(argv[1], "scribble") == 0) return hvtrace::agent::ScribbleMain(argc - 1, argv + 1);
  hvtrace::agent::AgentOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--region" && has_value) options.region_path = argv[++i];
    else if (arg == "--tracefs" && has_value) options.tracefs = argv[++i];
    else if (arg == "--sysfs" && has_value) options.sysfs_pci_devices = argv[++i];
    else if (arg == "--run-for" && has_value) options.run_for_ms = std::strtoull(argv[++i], nullptr, 10);
    else if (arg == "--keep-clock") options.set_mono_clock = false;
    else if (arg == "-v") options.verbose = true;
    else {
      Usage();
      return 2;
    }
  }
  hvtrace::agent::Agent agent(options);
  return agent.Run();
}
