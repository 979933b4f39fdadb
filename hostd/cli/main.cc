// hvtrace: the command-line front end. Dispatches to the command table.
#include <cstdio>
#include <cstring>
#include <iterator>

#include "commands.h"

namespace hvtrace::cli {
namespace {

constexpr Command kCommands[] = {
    {"report", "decode a trace.dat like `trace-cmd report` (text or JSON lines)", RunReport},
    {"show", "print a capture's events per boot (or decode a raw region file with --region)", RunShow},
    {"ping", "check that hvtraced answers on its control socket", RunPing},
    {"list", "list the VMs hvtraced knows and their state", RunList},
    {"status", "show one VM's state, last event, last capture and last error", RunStatus},
    {"captures", "list a VM's captures (newest last)", RunCaptures},
    {"boot", "ask hvtraced to boot a guest with a host-backed boot trace buffer", RunBoot},
    {"qemu-args", "print the QEMU argv + kernel params for a boot buffer (run QEMU yourself)", RunQemuArgs},
    {"adopt", "let hvtraced watch a QEMU you started (--qmp SOCK --boot-region F@GPA:SIZE)", RunAdopt},
    {"capture", "snapshot a VM's trace region now, guest keeps running", RunCapture},
    {"attach", "hot-plug a trace region into a running VM; the guest agent fills it", RunAttach},
    {"detach", "unplug the region again (captures still read it)", RunDetach},
    {"stream", "print an attached VM's events live (trace-cmd text or JSON lines)", RunStream},
    {"stop", "stop watching a VM (and shut it down if hvtraced booted it)", RunStop},
    {"daemon-shutdown", "ask hvtraced to stop cleanly", RunDaemonShutdown},
    {"domain-xml", "libvirt domain XML + kernel params for a host-backed boot range", RunDomainXml},
    {"libvirt-attach", "hot-plug an ivshmem region into a running libvirt domain", RunLibvirtAttach},
    {"libvirt-detach", "unplug it again (waits for DEVICE_REMOVED)", RunLibvirtDetach},
    {"formats", "harvest a kernel's event formats into the cache; list cached kernels", RunFormats},
};

int Usage(FILE* out) {
  std::fprintf(out, "usage: hvtrace <command> [args]\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "\n`hvtrace <command> --help` describes a command.\n");
  return out == stdout ? 0 : 2;
}

}  // namespace
}  // namespace hvtrace::cli

int main(int argc, char** argv) {
  using hvtrace::cli::kCommands;
  if (argc < 2) return hvtrace::cli::Usage(stderr);
  if (!std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    return hvtrace::cli::Usage(stdout);
  }
  for (const hvtrace::cli::Command& c : kCommands) {
    if (!std::strcmp(argv[1], c.name)) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "hvtrace: unknown command '%s'\n", argv[1]);
  return hvtrace::cli::Usage(stderr);
}
