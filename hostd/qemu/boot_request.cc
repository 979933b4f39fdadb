#include "boot_request.h"

#include "boot_trace.h"
#include "kvm_probe.h"

namespace hvtrace::hostd {

using nlohmann::json;

json BootRequest::ToJson() const {
  return {{"name", name},
          {"kernel", kernel},
          {"initrd", initrd},
          {"append", append},
          {"cpus", cpus},
          {"memory_mib", memory_mib},
          {"trace_size_mib", trace_size_mib},
          {"events", events},
          {"accel", accel},
          {"trace_boot", trace_boot},
          {"devices", devices}};
}

Result<BootRequest> BootRequest::FromJson(const json& args) {
  BootRequest r;
  if (!args.is_object()) return Error{"boot: args must be an object"};
  auto str = [&](const char* key, std::string& out, bool required) -> Status {
    auto it = args.find(key);
    if (it == args.end() || it->is_null()) {
      if (required) return Error{std::string("boot: args.") + key + " is required"};
      return {};
    }
    if (!it->is_string()) return Error{std::string("boot: args.") + key + " must be a string"};
    out = it->get<std::string>();
    return {};
  };
  auto num = [&](const char* key, uint64_t lo, uint64_t hi, uint64_t& out) -> Status {
    auto it = args.find(key);
    if (it == args.end() || it->is_null()) return {};
    if (!it->is_number_unsigned())
      return Error{std::string("boot: args.") + key + " must be a positive integer"};
    uint64_t v = it->get<uint64_t>();
    if (v < lo || v > hi) {
      return Error{std::string("boot: args.") + key + " = " + std::to_string(v) + " is outside " +
                   std::to_string(lo) + ".." + std::to_string(hi)};
    }
    out = v;
    return {};
  };
  for (Status s : {str("name", r.name, true), str("kernel", r.kernel, true),
                   str("initrd", r.initrd, false), str("append", r.append, false),
                   str("events", r.events, false), str("accel", r.accel, false)}) {
    if (!s.ok()) return s.error();
  }
  uint64_t cpus = static_cast<uint64_t>(r.cpus);
  for (Status s : {num("cpus", 1, 64, cpus), num("memory_mib", 256, 65536, r.memory_mib),
                   num("trace_size_mib", 1, 1024, r.trace_size_mib)}) {
    if (!s.ok()) return s.error();
  }
  r.cpus = static_cast<int>(cpus);
  if (auto it = args.find("trace_boot"); it != args.end() && !it->is_null()) {
    if (!it->is_boolean()) return Error{"boot: args.trace_boot must be true or false"};
    r.trace_boot = it->get<bool>();
  }
  if (auto it = args.find("devices"); it != args.end() && !it->is_null()) {
    if (!it->is_array() || it->size() > std::size(kHandshakeDevices)) {
      return Error{"boot: args.devices must be a list of at most 3 device names"};
    }
    for (const json& d : *it) {
      if (!d.is_string()) return Error{"boot: args.devices must hold strings"};
      r.devices.push_back(d.get<std::string>());
    }
    if (Status s = CheckHandshakeDevices(r.devices); !s.ok())
      return Error{"boot: args.devices: " + s.error().message};
  }
  if (auto a = ParseAccel(r.accel); !a.ok()) return a.error();
  return r;
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
  c.initrd = r.initrd;
  c.cmdline = r.append;
  c.qmp_socket = paths.qmp_socket;
  c.console_log = paths.console_log;
  c.console_socket = paths.console_socket;
  c.meta_socket = paths.meta_socket;
  c.qemu_log = paths.qemu_log;
  c.panic_device = PanicDevice::kIsa;
  c.pause_on_panic = true;
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
