// hvtrace commands for libvirt domains:
//   domain-xml       the domain definition (or the pieces to edit into one)
//                    for a host-backed boot range
//   libvirt-attach   hot-plug an ivshmem region into a running domain
//   libvirt-detach   take it out again, proven by DEVICE_REMOVED
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <cstring>
#include <string>
#include <string_view>

#include "boot_request.h"
#include "commands.h"
#include "config.h"
#include "control_client.h"
#include "daemon_call.h"
#include "domain_xml.h"
#include "libvirt_attach.h"
#include "units.h"
#include "libvirt_client.h"

namespace hvtrace::cli {
namespace {

using hostd::kMiB;

std::string DefaultUri() {
  const char* env = std::getenv("HVTRACE_LIBVIRT_URI");
  return env && *env ? env : "qemu:///system";
}

// "--flag value" or "--flag=value"; advances |i|.
bool TakeValue(int argc, char** argv, int& i, std::string_view flag, std::string& out) {
  std::string_view a = argv[i];
  if (a == flag) {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "hvtrace: %.*s needs a value\n", static_cast<int>(flag.size()), flag.data());
      std::exit(2);
    }
    out = argv[++i];
    return true;
  }
  if (a.size() > flag.size() && a.substr(0, flag.size()) == flag && a[flag.size()] == '=') {
    out = std::string(a.substr(flag.size() + 1));
    return true;
  }
  return false;
}

bool ParseSize(const std::string& text, uint64_t& out) {
  Result<uint64_t> v = hostd::ParseKernelSize(text);
  if (!v.ok()) {
    std::fprintf(stderr, "hvtrace: %s\n", v.error().message.c_str());
    return false;
  }
  out = *v;
  return true;
}

constexpr char kDomainXmlUsage[] =
    "usage: hvtrace domain-xml --name NAME --kernel VMLINUZ [--initrd INITRD]\n"
    "         [--memory 1088M] [--range 16M] [--cpus 2] [--events LIST (default: the boot sequence)]\n"
    "         [--instance boot_map] [--on-crash preserve|destroy|...] [--cmdline 'console=ttyS0']\n"
    "         [--console-socket PATH] [--console-log PATH] [--params | --numa]\n"
    "Prints a TCG domain whose NUMA cell 1 is file-backed and shared, with the\n"
    "kernel's persistent ring buffer at its start (memmap= + trace_instance=).\n"
    "--params prints only the kernel parameters, --numa only the <cpu><numa>\n"
    "element, for editing an existing domain (virsh edit). libvirt puts the\n"
    "cell's file in qemu.conf's memory_backing_dir: make that a tmpfs.\n";

}  // namespace

int RunDomainXml(int argc, char** argv) {
  hostd::BootBufferDomainRequest req;
  std::string v;
  bool params_only = false, numa_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kDomainXmlUsage, stdout);
      return 0;
    } else if (TakeValue(argc, argv, i, "--name", req.name) ||
               TakeValue(argc, argv, i, "--kernel", req.kernel) ||
               TakeValue(argc, argv, i, "--initrd", req.initrd) ||
               TakeValue(argc, argv, i, "--events", req.events) ||
               TakeValue(argc, argv, i, "--instance", req.instance_name) ||
               TakeValue(argc, argv, i, "--on-crash", req.on_crash) ||
               TakeValue(argc, argv, i, "--cmdline", req.extra_cmdline) ||
               TakeValue(argc, argv, i, "--console-socket", req.console_socket) ||
               TakeValue(argc, argv, i, "--console-log", req.console_log)) {
    } else if (TakeValue(argc, argv, i, "--memory", v)) {
      if (!ParseSize(v, req.memory_bytes)) return 2;
    } else if (TakeValue(argc, argv, i, "--range", v)) {
      if (!ParseSize(v, req.range_bytes)) return 2;
    } else if (TakeValue(argc, argv, i, "--cpus", v)) {
      req.vcpus = std::atoi(v.c_str());
    } else if (a == "--params") {
      params_only = true;
    } else if (a == "--numa") {
      numa_only = true;
    } else {
      std::fprintf(stderr, "hvtrace domain-xml: unknown argument '%s'\n%s", argv[i], kDomainXmlUsage);
      return 2;
    }
  }
  if (req.name.empty()) req.name = "hvtrace-guest";
  // The same boot sequence `hvtrace boot` records (initcalls, irq, timers, sched).
  if (req.events.empty()) req.events = hostd::kDefaultBootEvents;
  if (req.kernel.empty() && !params_only && !numa_only) {
    std::fprintf(stderr, "hvtrace domain-xml: --kernel is required\n%s", kDomainXmlUsage);
    return 2;
  }
  if (req.kernel.empty()) req.kernel = "-";  // Only the pieces are printed.
  Result<hostd::BootBufferDomainXml> out = hostd::MakeBootBufferDomainXml(req);
  if (!out.ok()) {
    std::fprintf(stderr, "hvtrace domain-xml: %s\n", out.error().message.c_str());
    return 1;
  }
  if (params_only) {
    std::printf("%s\n", out->kernel_params.c_str());
  } else if (numa_only) {
    std::printf("%s\n", out->numa_xml.c_str());
  } else {
    std::fputs(out->domain_xml.c_str(), stdout);
  }
  return 0;
}

namespace {

constexpr char kAttachUsage[] =
    "usage: hvtrace libvirt-attach DOMAIN --shm NAME [--size 4M] [--replace-stale]\n"
    "         [--uri URI] [--timeout-ms 10000]\n"
    "Hot-plugs <shmem name='NAME'> (ivshmem-plain) into the running DOMAIN (name\n"
    "or UUID) and waits for DEVICE_ADDED. The region is /dev/shm/NAME. URI defaults\n"
    "to $HVTRACE_LIBVIRT_URI or qemu:///system.\n";
constexpr char kDetachUsage[] =
    "usage: hvtrace libvirt-detach DOMAIN --shm NAME [--uri URI] [--timeout-ms 10000]\n"
    "Unplugs the region and waits for DEVICE_REMOVED (the guest must release it).\n";

struct CommonArgs {
  std::string domain, shm, uri = DefaultUri();
  uint64_t size = 4 * kMiB;
  bool replace_stale = false;
  int timeout_ms = 10000;
};

int ParseCommon(int argc, char** argv, const char* usage, CommonArgs& args) {
  std::string v;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      return 0;
    } else if (TakeValue(argc, argv, i, "--shm", args.shm) ||
               TakeValue(argc, argv, i, "--uri", args.uri)) {
    } else if (TakeValue(argc, argv, i, "--size", v)) {
      if (!ParseSize(v, args.size)) return 2;
    } else if (TakeValue(argc, argv, i, "--timeout-ms", v)) {
      args.timeout_ms = std::atoi(v.c_str());
    } else if (a == "--replace-stale") {
      args.replace_stale = true;
    } else if (!a.empty() && a[0] != '-' && args.domain.empty()) {
      args.domain = std::string(a);
    } else {
      std::fprintf(stderr, "hvtrace: unknown argument '%s'\n%s", argv[i], usage);
      return 2;
    }
  }
  if (args.domain.empty() || args.shm.empty()) {
    std::fputs(usage, stderr);
    return 2;
  }
  return -1;
}

}  // namespace

int RunLibvirtAttach(int argc, char** argv) {
  CommonArgs args;
  if (int rc = ParseCommon(argc, argv, kAttachUsage, args); rc >= 0) return rc;
  hostd::LibvirtClient::Options options;
  options.uri = args.uri;
  Result<std::shared_ptr<hostd::LibvirtClient>> client = hostd::LibvirtClient::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "hvtrace libvirt-attach: %s\n", client.error().message.c_str());
    return 1;
  }
  hostd::ShmemAttachRequest req;
  req.domain = args.domain;
  req.shm_name = args.shm;
  req.size_bytes = args.size;
  req.replace_stale = args.replace_stale;
  req.timeout = std::chrono::milliseconds(args.timeout_ms);
  Result<hostd::ShmemAttachment> a = hostd::AttachShmem(*client, req);
  if (!a.ok()) {
    std::fprintf(stderr, "hvtrace libvirt-attach: %s\n", a.error().message.c_str());
    return 1;
  }
  if (!a->stale_note.empty()) std::fprintf(stderr, "hvtrace libvirt-attach: %s\n", a->stale_note.c_str());
  std::printf("attached %s to domain %s (%s) as %s: %llu bytes, owner uid %u, DEVICE_ADDED after %.1f ms\n",
              a->path.c_str(), a->domain_name.c_str(), a->domain_uuid.c_str(), a->alias.c_str(),
              static_cast<unsigned long long>(a->size_bytes), static_cast<unsigned>(a->owner_uid),
              a->attach_ms);
  return 0;
}

int RunLibvirtDetach(int argc, char** argv) {
  CommonArgs args;
  if (int rc = ParseCommon(argc, argv, kDetachUsage, args); rc >= 0) return rc;
  hostd::LibvirtClient::Options options;
  options.uri = args.uri;
  Result<std::shared_ptr<hostd::LibvirtClient>> client = hostd::LibvirtClient::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "hvtrace libvirt-detach: %s\n", client.error().message.c_str());
    return 1;
  }
  Status s = hostd::DetachShmem(*client, args.domain, args.shm,
                                std::chrono::milliseconds(args.timeout_ms));
  if (!s.ok()) {
    std::fprintf(stderr, "hvtrace libvirt-detach: %s\n", s.error().message.c_str());
    return 1;
  }
  std::printf("detached %s from domain %s (DEVICE_REMOVED received; /dev/shm/%s is kept)\n",
              args.shm.c_str(), args.domain.c_str(), args.shm.c_str());
  return 0;
}

namespace {

constexpr char kAdoptDomainUsage[] =
    "usage: hvtrace adopt NAME [--domain DOMAIN] [--socket PATH] [--json]\n"
    "hvtraced serves the running libvirt domain DOMAIN (name or UUID; default NAME)\n"
    "as VM NAME: its trace region is found from the domain's XML (an hvtrace shmem\n"
    "device, else the boot range of a domain made by `hvtrace domain-xml`), and a\n"
    "panic is captured before libvirt acts on <on_crash>. The daemon's config key\n"
    "libvirt_uri names the libvirt connection.\n"
    "(QEMU launched by hand: hvtrace adopt NAME --qmp SOCK --boot-region FILE@GPA:SIZE)\n";


}  // namespace

int RunAdoptDomain(int argc, char** argv) {
  std::string name, domain, socket;
  bool json_output = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kAdoptDomainUsage, stdout);
      return 0;
    } else if (TakeValue(argc, argv, i, "--domain", domain) ||
               TakeValue(argc, argv, i, "--socket", socket)) {
    } else if (a == "--json") {
      json_output = true;
    } else if (!a.empty() && a[0] != '-' && name.empty()) {
      name = std::string(a);
    } else {
      std::fprintf(stderr, "hvtrace adopt: unknown argument '%s'\n%s", argv[i], kAdoptDomainUsage);
      return 2;
    }
  }
  if (name.empty()) {
    std::fputs(kAdoptDomainUsage, stderr);
    return 2;
  }
  nlohmann::json args = {{"name", name}};
  if (!domain.empty()) args["domain"] = domain;
  auto result = CallDaemon("adopt", socket, "adopt", args, std::chrono::seconds(60));
  if (!result) return 1;
  if (json_output) {
    std::printf("%s\n", result->dump(2).c_str());
    return 0;
  }
  const nlohmann::json& region = (*result)["region"];
  std::printf("adopted %s: libvirt domain %s (%s), %s region %s (offset %llu, %llu bytes)\n",
              name.c_str(), result->value("domain", std::string()).c_str(),
              result->value("uuid", std::string()).c_str(),
              region.value("kind", std::string()).c_str(), region.value("path", std::string()).c_str(),
              static_cast<unsigned long long>(region.value("offset", uint64_t{0})),
              static_cast<unsigned long long>(region.value("size", uint64_t{0})));
  return 0;
}

}  // namespace hvtrace::cli
