#include "agent_args.h"

#include <getopt.h>

#include <cerrno>
#include <cstdlib>

#include "hvtrace/meta_leaving.h"

namespace hvtrace::agent {
namespace {

constexpr char kUsage[] =
    "usage: hvtrace-agent [--region PATH] [--tracefs DIR] [--instance NAME] [--sysfs DIR]\n"
    "                     [--keep-clock] [--run-for MS] [--meta-port PATH | --no-meta]\n"
    "                     [--leave-wait MS]\n"
    "                     [-v|--verbose] [-h|--help] [--version]\n"
    "\n"
    "  --region PATH   use this region file instead of finding the ivshmem device\n"
    "  --tracefs DIR   tracefs mount (default /sys/kernel/tracing)\n"
    "  --instance NAME the tracefs instance the agent owns, created if absent and\n"
    "                  never removed (default hvtrace: DIR/instances/hvtrace)\n"
    "  --sysfs DIR     PCI devices directory (default /sys/bus/pci/devices)\n"
    "  --keep-clock    leave the instance's trace clock alone (default: set \"mono\")\n"
    "  --run-for MS    stop after MS milliseconds (default: run until killed)\n"
    "  --meta-port PATH  send the metadata channel to PATH (default: find the\n"
    "                  virtio-serial port org.hvtrace.agent.0)\n"
    "  --no-meta       send no metadata, do not look for the port\n"
    "  --leave-wait MS when stopped (SIGTERM/SIGINT), tell the host this kernel is\n"
    "                  about to go and wait at most MS for it to copy the boot\n"
    "                  range (default 2000, at most 60000; 0: do not tell it)\n"
    "  -v, --verbose   also log every ivshmem device that is added and every\n"
    "                  metadata frame\n";

enum LongOnly {
  kRegion = 256,
  kTracefs,
  kInstance,
  kSysfs,
  kKeepClock,
  kRunFor,
  kVersion,
  kMetaPort,
  kNoMeta,
  kLeaveWait
};

bool ParseMs(const char* text, uint64_t* value) {
  if (text[0] < '0' || text[0] > '9') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *value = v;
  return true;
}

}  // namespace

std::optional<int> ParseAgentArgs(int argc, char** argv, AgentOptions* options, std::FILE* out,
                                  std::FILE* err) {
  static const option kOptions[] = {
      {"region", required_argument, nullptr, kRegion},
      {"tracefs", required_argument, nullptr, kTracefs},
      {"instance", required_argument, nullptr, kInstance},
      {"sysfs", required_argument, nullptr, kSysfs},
      {"keep-clock", no_argument, nullptr, kKeepClock},
      {"run-for", required_argument, nullptr, kRunFor},
      {"meta-port", required_argument, nullptr, kMetaPort},
      {"no-meta", no_argument, nullptr, kNoMeta},
      {"leave-wait", required_argument, nullptr, kLeaveWait},
      {"verbose", no_argument, nullptr, 'v'},
      {"help", no_argument, nullptr, 'h'},
      {"version", no_argument, nullptr, kVersion},
      {nullptr, 0, nullptr, 0},
  };
  optind = 0;  // Full rescan: glibc's way to parse a second command line.
  opterr = 0;  // Our own message, to |err|.
  auto usage_error = [&](const char* what, const char* arg) {
    std::fprintf(err, "hvtrace-agent: %s%s\n%s", what, arg, kUsage);
    return 2;
  };
  // '+': stop at the first operand instead of permuting argv; there are none.
  for (int c; (c = getopt_long(argc, argv, "+:vh", kOptions, nullptr)) != -1;) {
    switch (c) {
      case kRegion:
        options->region_path = optarg;
        break;
      case kTracefs:
        options->tracefs = optarg;
        break;
      case kInstance:
        options->instance = optarg;
        break;
      case kSysfs:
        options->sysfs_pci_devices = optarg;
        break;
      case kKeepClock:
        options->set_mono_clock = false;
        break;
      case kRunFor:
        if (!ParseMs(optarg, &options->run_for_ms)) {
          return usage_error("--run-for takes milliseconds, not ", optarg);
        }
        break;
      case kMetaPort:
        options->meta.port = optarg;
        break;
      case kNoMeta:
        options->meta.enabled = false;
        break;
      case kLeaveWait: {
        uint64_t ms = 0;
        if (!ParseMs(optarg, &ms) || ms > meta::kMaxLeaveWaitMs) {
          return usage_error("--leave-wait takes milliseconds up to 60000, not ", optarg);
        }
        options->meta.leave_wait_ms = static_cast<uint32_t>(ms);
        break;
      }
      case 'v':
        options->verbose = true;
        break;
      case 'h':
        std::fputs(kUsage, out);
        return 0;
      case kVersion:
        std::fprintf(out, "hvtrace-agent %s\n", HVTRACE_VERSION);
        return 0;
      case ':':
        return usage_error("missing value for ", argv[optind - 1]);
      default:
        if (optopt > 0 &&
            optopt < 256) {  // A short option; argv[optind - 1] may be a group ("-vx").
          const char name[3] = {'-', static_cast<char>(optopt), '\0'};
          return usage_error("unknown option ", name);
        }
        return usage_error("unknown option ", argv[optind - 1]);
    }
  }
  if (optind < argc) return usage_error("unexpected argument ", argv[optind]);
  return std::nullopt;
}

}  // namespace hvtrace::agent
