// hvtrace domain-xml: the libvirt domain definition (or the pieces to edit
// into one) for a host-backed boot range. Pure text: this binary does not
// talk to libvirt (`hvtrace adopt` / `attach` ask hvtraced to).
#include <cstdio>
#include <string>

#include "boot_request.h"
#include "command.h"
#include "command_table.h"
#include "domain_xml.h"

namespace hvtrace::cli {
namespace {

class DomainXmlCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    app.add_option("--name", req_.name, "the domain's name (default hvtrace-guest)");
    app.add_option("--kernel", req_.kernel,
                   "the guest kernel (<os><kernel>); required for the whole domain")
        ->type_name("VMLINUZ");
    app.add_option("--initrd", req_.initrd, "its initramfs")->type_name("INITRD");
    // Bare numbers stay bytes here, as the kernel reads memmap= sizes.
    AddSizeOption(
        app, "--memory", 1, 1, [this](uint64_t b) { req_.memory_bytes = b; },
        "guest memory, default 1088M (a bare number is bytes)");
    AddSizeOption(
        app, "--range", 1, 1, [this](uint64_t b) { req_.range_bytes = b; },
        "the boot trace range, default 16M (a bare number is bytes)");
    AddCountOption(
        app, "--cpus", 1, 4096, [this](uint64_t n) { req_.vcpus = static_cast<int>(n); },
        "vCPUs (default 2)");
    app.add_option("--events", req_.events, "trace_instance events (default: the boot sequence)")
        ->type_name("LIST");
    app.add_option("--instance", req_.instance_name,
                   "the trace instance's name (default boot_map)");
    app.add_option("--on-crash", req_.on_crash, "libvirt's <on_crash> (default preserve)")
        ->type_name("preserve|destroy|...");
    app.add_option("--cmdline", req_.extra_cmdline,
                   "more kernel parameters (default console=ttyS0)");
    app.add_option("--console-socket", req_.console_socket, "serial console as a unix socket")
        ->type_name("PATH");
    app.add_option("--console-log", req_.console_log, "serial log file")->type_name("PATH");
    auto* params = app.add_flag("--params", params_only_, "print only the kernel parameters");
    app.add_flag("--numa", numa_only_, "print only the <cpu><numa> element, for `virsh edit`")
        ->excludes(params);
    app.footer(
        "Prints a TCG domain whose NUMA cell 1 is file-backed and shared, with the kernel's\n"
        "persistent ring buffer at its start (memmap= + trace_instance=). libvirt puts the cell's\n"
        "file in qemu.conf's memory_backing_dir: make that a tmpfs.");
  }
  Status Check() const override {
    if (req_.kernel.empty() && !params_only_ && !numa_only_) return Error{"--kernel is required"};
    return {};
  }
  int Run() override {
    hostd::BootBufferDomainRequest req = req_;
    if (req.name.empty()) req.name = "hvtrace-guest";
    // The same boot sequence `hvtrace boot` records (initcalls, irq, timers, sched).
    if (req.events.empty()) req.events = hostd::kDefaultBootEvents;
    if (req.kernel.empty()) req.kernel = "-";  // Only the pieces are printed.
    Result<hostd::BootBufferDomainXml> out = hostd::MakeBootBufferDomainXml(req);
    if (!out.ok()) {
      std::fprintf(stderr, "hvtrace domain-xml: %s\n", out.error().message.c_str());
      return kExitFailed;
    }
    if (params_only_) {
      std::printf("%s\n", out->kernel_params.c_str());
    } else if (numa_only_) {
      std::printf("%s\n", out->numa_xml.c_str());
    } else {
      std::fputs(out->domain_xml.c_str(), stdout);
    }
    return kExitOk;
  }

 private:
  hostd::BootBufferDomainRequest req_;
  bool params_only_ = false;
  bool numa_only_ = false;
};

}  // namespace

void AddDomainXmlCommand(CommandTable& table) {
  table.Add("domain-xml", "libvirt domain XML + kernel params for a host-backed boot range",
            std::make_unique<DomainXmlCommand>());
}

}  // namespace hvtrace::cli
