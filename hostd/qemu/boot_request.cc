#include "boot_request.h"

#include "boot_trace.h"
#include "kvm_probe.h"

namespace hvtrace::hostd {

using nlohmann::json;

Status BootRequest::Check() const {
  if (Status s = CheckHandshakeDevices(devices); !s.ok())
    return Error{"boot: args.devices: " + s.error().message};
  if (auto a = ParseAccel(accel); !a.ok()) return Error{"boot: " + a.error().message};
  if (!vmcore.empty() && vmcore != "off" && vmcore != "on-panic") {
    return Error{"boot: vmcore '" + vmcore + "' is not one of off, on-panic"};
  }
  return {};
}

BootPaths DefaultBootPaths(const std::string& name, const std::filesystem::path& run_dir,
                           const std::filesystem::path& vm_dir) {
  BootPaths p;
  p.qmp_socket = (run_dir / (name + ".qmp")).string();
  p.console_log = (vm_dir / "console.log").string();
  p.console_socket = (run_dir / (name + ".console")).string();
  // Beside the backing file, in the directory only the daemon's user may
  // enter: a local user who connected first would hold QEMU's one client
  // slot and read the guest's kallsyms.
  p.meta_socket = (run_dir / kMemoryDirName / ("hvtrace-" + name + ".meta")).string();
  p.qemu_log = (vm_dir / "qemu.log").string();
  p.qemu_trace_log = (vm_dir / kQemuTraceLogName).string();
  p.backing_file = (run_dir / kMemoryDirName / ("hvtrace-" + name)).string();
  return p;
}

Result<Accel> ParseAccel(std::string_view text) {
  if (text == "auto") return Accel::kAuto;
  if (text == "tcg") return Accel::kTcg;
  if (text == "kvm") return Accel::kKvm;
  return Error{"accel '" + std::string(text) + "' is not one of auto, tcg, kvm"};
}

bool ResolveKvm(Accel accel, const std::string& kernel) {
  switch (accel) {
    case Accel::kKvm:
      return true;
    case Accel::kTcg:
      return false;
    case Accel::kAuto:
      return KvmUsable(kernel);
  }
  return false;
}

Result<VmConfig> MakeBootVmConfig(const BootRequest& r, const BootPaths& paths) {
  auto accel = ParseAccel(r.accel);
  if (!accel.ok()) return accel.error();
  VmConfig c;
  c.name = r.name;
  c.accel = *accel;
  c.vcpus = r.cpus;
  c.memory_bytes = r.memory_mib * kMiB;
  c.kernel = r.kernel;
  c.initrd = r.initrd.value_or("");
  c.cmdline = r.append;
  c.qmp_socket = paths.qmp_socket;
  c.console_log = paths.console_log;
  c.console_socket = paths.console_socket;
  c.meta_socket = paths.meta_socket;
  c.qemu_log = paths.qemu_log;
  c.panic_device = PanicDevice::kIsa;
  c.pause_on_panic = true;
  c.vmcoreinfo = true;  // A dump then carries VMCOREINFO (makedumpfile, crash).
  c.devices = r.devices;
  if (r.trace_boot) {
    c.trace_log = paths.qemu_trace_log;
    c.trace_events = BootTraceEvents();
    // The guest's half of the handshakes of built-in drivers (virtio_pci,
    // virtio_console): boot kprobes the initramfs copies into the boot
    // instance. A command line that defines its own keeps them, and one
    // that picks its own trace clock keeps it.
    auto add = [&c](std::string_view key, const char* param) {
      if (c.cmdline.find(key) != std::string::npos) return;
      c.cmdline += (c.cmdline.empty() ? "" : " ") + std::string(param);
    };
    add("kprobe_event=", kHandshakeKprobeParam);
    add("trace_clock=", kKeepLocalTraceClock);
  }
  BootRangeConfig br;
  br.backing_path = paths.backing_file;
  br.range_bytes = r.trace_size_mib * kMiB;
  br.events = r.events;
  c.boot_range = br;
  return c;
}

}  // namespace hvtrace::hostd
