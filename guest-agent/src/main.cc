// hvtrace-agent: see agent.h.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "agent.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: hvtrace-agent [--region PATH] [--tracefs DIR] [--sysfs DIR] [--keep-clock]\n"
               "                     [--run-for MS] [-v]\n");
}

}  // namespace

int main(int argc, char** argv) {
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
