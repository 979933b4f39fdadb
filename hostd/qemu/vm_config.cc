#include "vm_config.h"

#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>

#include "boot_trace.h"
#include "hvtrace/meta_channel.h"
#include "kvm_probe.h"
#include "qemu_caps.h"
#include "units.h"

namespace hvtrace::hostd {
namespace {

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Names that end up in QEMU ids or on the kernel command line.
bool IsPlainName(const std::string& s, bool allow_colon_comma) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' ||
           (allow_colon_comma && (c == ':' || c == ',' || c == '*' || c == '^'));
  });
}

Status CheckSocketPath(const std::string& what, const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Error{what + " path '" + path + "' is " + std::to_string(path.size()) +
                 " bytes; unix socket paths must be shorter than " +
                 std::to_string(sizeof(sockaddr_un::sun_path))};
  }
  return {};
}

bool HasToken(const std::string& cmdline, const std::string& prefix) {
  size_t pos = 0;
  while ((pos = cmdline.find(prefix, pos)) != std::string::npos) {
    if (pos == 0 || cmdline[pos - 1] == ' ') return true;
    ++pos;
  }
  return false;
}

}  // namespace

std::string OptValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    out.push_back(c);
    if (c == ',') out.push_back(',');
  }
  return out;
}

std::string KernelSize(uint64_t bytes) {
  if (bytes != 0 && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + "M";
  if (bytes != 0 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + "K";
  return std::to_string(bytes);
}

bool KvmUsable(const std::string& kernel) { return KvmVerdict(kernel).usable; }

namespace {

Status CheckVmConfig(const VmConfig& config, const std::string& vm) {
  if (!IsPlainName(config.name, false)) return Error{vm + "name must be non-empty [A-Za-z0-9_.-]"};
  if (config.qemu_binary.empty()) return Error{vm + "no QEMU binary"};
  if (config.vcpus < 1 || config.vcpus > 255) {
    return Error{vm + "vCPU count " + std::to_string(config.vcpus) + " is outside 1..255"};
  }
  if (config.memory_bytes == 0 || config.memory_bytes % kMiB != 0) {
    return Error{vm + "memory " + std::to_string(config.memory_bytes) +
                 " bytes is not a whole number of MiB"};
  }
  if (config.kernel.empty()) return Error{vm + "no kernel"};
  if (config.qmp_socket.empty()) return Error{vm + "no QMP socket path"};
  if (Status s = CheckSocketPath("QMP socket", config.qmp_socket); !s.ok())
    return Error{vm + s.error().message};
  if (!config.console_socket.empty()) {
    if (Status s = CheckSocketPath("console socket", config.console_socket); !s.ok()) {
      return Error{vm + s.error().message};
    }
  }
  if (!config.meta_socket.empty()) {
    if (Status s = CheckSocketPath("metadata channel socket", config.meta_socket); !s.ok()) {
      return Error{vm + s.error().message};
    }
  }
  return {};
}

Result<bool> ChooseKvm(const VmConfig& config, bool kvm_usable, const std::string& vm) {
  switch (config.accel) {
    case Accel::kAuto:
      return kvm_usable;
    case Accel::kKvm:
      if (!kvm_usable) return Error{vm + "KVM requested but /dev/kvm is not usable"};
      return true;
    case Accel::kTcg:
      return false;
  }
  return false;
}

// The boot range: node 1 backed by the host file, and the kernel parameters
// that put the persistent ring buffer there.
Status AddBootRange(const VmConfig& config, const std::string& vm, QemuPlan& plan,
                    std::string& cmdline, std::set<std::string>& backing_paths) {
  const BootRangeConfig& br = *config.boot_range;
  if (br.backing_path.empty()) return Error{vm + "boot range has no backing file path"};
  if (!IsPlainName(br.instance_name, false)) {
    return Error{vm + "boot range instance name '" + br.instance_name + "' must be [A-Za-z0-9_.-]"};
  }
  if (!br.events.empty() && !IsPlainName(br.events, true)) {
    return Error{vm + "boot range events '" + br.events +
                 "' may only hold names, ':', ',', '*', '^'"};
  }
  BootRangeRequest request;
  request.machine = config.machine;
  request.memory_bytes = config.memory_bytes;
  request.range_bytes = br.range_bytes;
  request.node0_bytes = br.node0_bytes;
  Result<BootRangeLayout> layout = ComputeBootRangeLayout(request);
  if (!layout.ok()) return Error{vm + layout.error().message};
  // The kernel splits the range evenly over nr_cpu_ids; each CPU's chunk
  // holds its metadata page(s) plus the sub-buffers.
  const uint64_t per_cpu = layout->range_bytes / static_cast<uint64_t>(config.vcpus);
  if (per_cpu < 16 * kGuestPageSize) {
    return Error{vm + "boot range of " + KernelSize(br.range_bytes) + " gives each of " +
                 std::to_string(config.vcpus) + " vCPUs only " + std::to_string(per_cpu) +
                 " bytes; need at least " + std::to_string(16 * kGuestPageSize)};
  }
  backing_paths.insert(br.backing_path);
  plan.argv.insert(
      plan.argv.end(),
      {"-object", "memory-backend-ram,id=hvt_node0,size=" + std::to_string(layout->node0_bytes),
       "-object",
       "memory-backend-file,id=hvt_node1,size=" + std::to_string(layout->node1_bytes) +
           ",mem-path=" + OptValue(br.backing_path) + ",share=on",
       "-numa", "node,nodeid=0,memdev=hvt_node0", "-numa", "node,nodeid=1,memdev=hvt_node1"});
  const std::string where = HexText(layout->range_gpa);
  cmdline += " memmap=" + KernelSize(layout->range_bytes) + "$" + where;
  cmdline +=
      " trace_instance=" + br.instance_name + "@" + where + ":" + KernelSize(layout->range_bytes);
  if (!br.events.empty()) cmdline += "," + br.events;
  plan.boot_range = *layout;
  return {};
}

// Serial console: a socket for interaction, with QEMU logging every byte the
// guest writes, also while nobody is connected.
void AddConsole(const VmConfig& config, std::vector<std::string>& a) {
  if (!config.console_socket.empty()) {
    std::string chardev =
        "socket,id=hvt_con,path=" + OptValue(config.console_socket) + ",server=on,wait=off";
    // Appending, so hvtraced's rotation (log_rotation.h) can truncate it.
    if (!config.console_log.empty())
      chardev += ",logfile=" + OptValue(config.console_log) + ",logappend=on";
    a.insert(a.end(), {"-chardev", chardev, "-serial", "chardev:hvt_con"});
  } else if (!config.console_log.empty()) {
    a.insert(a.end(),
             {"-chardev", "file,id=hvt_con,path=" + OptValue(config.console_log) + ",append=on",
              "-serial", "chardev:hvt_con"});
  } else {
    a.insert(a.end(), {"-serial", "null"});
  }
}

// The metadata channel: a virtio-serial port the guest agent finds as
// /dev/virtio-ports/org.hvtrace.agent.0, its host end a socket QEMU listens on.
void AddMetaChannel(const VmConfig& config, std::vector<std::string>& a) {
  if (config.meta_socket.empty()) return;
  a.insert(a.end(),
           {"-device", "virtio-serial-pci,id=hvtrace-vser", "-chardev",
            "socket,id=hvtrace-meta,path=" + OptValue(config.meta_socket) + ",server=on,wait=off",
            "-device",
            "virtserialport,bus=hvtrace-vser.0,chardev=hvtrace-meta,name=" +
                std::string(meta::kMetaPortName)});
}

Status AddIvshmem(const VmConfig& config, const std::string& vm, std::vector<std::string>& a,
                  std::set<std::string>& backing_paths) {
  std::set<std::string> ids;
  for (size_t i = 0; i < config.ivshmem.size(); ++i) {
    const IvshmemConfig& iv = config.ivshmem[i];
    const std::string which = vm + "ivshmem '" + iv.id + "': ";
    if (!IsPlainName(iv.id, false) || !ids.insert(iv.id).second) {
      return Error{which + "id must be unique and [A-Za-z0-9_.-]"};
    }
    if (!IsPowerOfTwo(iv.size_bytes) || iv.size_bytes < kGuestPageSize) {
      return Error{which + "size " + std::to_string(iv.size_bytes) +
                   " is not a power of two of at least 4096 bytes (QEMU aborts on such a BAR)"};
    }
    if (iv.backing_path.empty()) return Error{which + "no backing file path"};
    if (!backing_paths.insert(iv.backing_path).second) {
      return Error{which + "backing file '" + iv.backing_path +
                   "' is already used by another region"};
    }
    const std::string memdev = "hvt_ivs" + std::to_string(i);
    a.insert(a.end(),
             {"-object",
              "memory-backend-file,id=" + memdev + ",size=" + std::to_string(iv.size_bytes) +
                  ",mem-path=" + OptValue(iv.backing_path) + ",share=on",
              "-device", "ivshmem-plain,memdev=" + memdev + ",id=" + iv.id});
  }
  return {};
}

// The host side of boot (boot_trace.h): handshake devices and QEMU's trace
// events; nothing at all unless asked for.
Status AddBootTrace(const VmConfig& config, const std::string& vm, std::vector<std::string>& a) {
  Result<std::vector<std::string>> devices = HandshakeDeviceArgs(config.devices);
  if (!devices.ok()) return Error{vm + devices.error().message};
  a.insert(a.end(), devices->begin(), devices->end());
  if (config.trace_log.empty()) return {};
  Result<std::vector<std::string>> trace = BootTraceArgs(config.trace_log, config.trace_events);
  if (!trace.ok()) return Error{vm + trace.error().message};
  a.insert(a.end(), trace->begin(), trace->end());
  return {};
}

}  // namespace

Result<QemuPlan> BuildQemuPlan(const VmConfig& config, bool kvm_usable, const QemuCaps& caps) {
  const std::string vm = "VM '" + config.name + "': ";
  if (Status s = CheckVmConfig(config, vm); !s.ok()) return s.error();
  Result<bool> kvm = ChooseKvm(config, kvm_usable, vm);
  if (!kvm.ok()) return kvm.error();

  // Multi-threaded TCG does not keep the kernel's live text patching safe:
  // about one 6.12 boot in 25 died with "Oops: int3" in sched_clock_cpu when
  // late_initcall flipped the sched_clock_stable jump label while the other
  // vCPU ran the patched code. One TCG thread runs the vCPUs in turn, so the
  // int3-then-sync protocol of text_poke_bp holds. KVM is unaffected.
  QemuPlan plan;
  auto& a = plan.argv;
  a = {config.qemu_binary,
       "-name",
       OptValue(config.name),
       "-no-user-config",
       "-nodefaults",
       "-display",
       "none",
       "-machine",
       config.machine == MachineType::kQ35 ? "q35" : "pc",
       "-accel",
       *kvm ? "kvm" : "tcg,thread=single",
       "-smp",
       std::to_string(config.vcpus),
       "-m",
       std::to_string(config.memory_bytes / kMiB) + "M"};
  if (!config.cpu_model.empty()) a.insert(a.end(), {"-cpu", config.cpu_model});

  std::set<std::string> backing_paths;
  std::string cmdline = config.cmdline;
  if (!HasToken(cmdline, "console="))
    cmdline += cmdline.empty() ? "console=ttyS0" : " console=ttyS0";
  if (config.boot_range) {
    if (Status s = AddBootRange(config, vm, plan, cmdline, backing_paths); !s.ok())
      return s.error();
  }
  a.insert(a.end(), {"-kernel", config.kernel});
  if (!config.initrd.empty()) a.insert(a.end(), {"-initrd", config.initrd});
  a.insert(a.end(), {"-append", cmdline});
  AddConsole(config, a);
  AddMetaChannel(config, a);
  a.insert(
      a.end(),
      {"-chardev", "socket,id=hvt_qmp,path=" + OptValue(config.qmp_socket) + ",server=on,wait=off",
       "-mon", "chardev=hvt_qmp,mode=control"});
  switch (config.panic_device) {
    case PanicDevice::kNone:
      break;
    case PanicDevice::kIsa:
      a.insert(a.end(), {"-device", "pvpanic"});
      break;
    case PanicDevice::kPci:
      a.insert(a.end(), {"-device", "pvpanic-pci"});
      break;
  }
  if (config.pause_on_panic) a.insert(a.end(), {"-action", "panic=pause"});
  if (config.vmcoreinfo) a.insert(a.end(), {"-device", "vmcoreinfo"});
  if (config.no_reboot) a.push_back("-no-reboot");
  if (Status s = AddIvshmem(config, vm, a, backing_paths); !s.ok()) return s.error();
  if (Status s = AddBootTrace(config, vm, a); !s.ok()) return s.error();
  if (config.sandbox) {
    a.insert(a.end(), {"-sandbox", std::string(config.run_as.empty() ? kQemuSandboxArg
                                                                     : kQemuSandboxRunAsArg)});
  }
  if (!config.run_as.empty()) {
    if (config.run_as.find_first_of(" \t,=/:") != std::string::npos || config.run_as[0] == '-') {
      return Error{vm + "qemu_user '" + config.run_as + "' is not a user name"};
    }
    Result<std::vector<std::string>> run_as = RunAsArgs(caps, config.run_as);
    if (!run_as.ok()) return Error{vm + run_as.error().message};
    a.insert(a.end(), run_as->begin(), run_as->end());
  }
  // Everything hvtraced chose, checked against this QEMU before it starts;
  // extra_args are the caller's own and QEMU judges them.
  if (Status s = CheckQemuArgv(caps, a, vm); !s.ok()) return s.error();
  a.insert(a.end(), config.extra_args.begin(), config.extra_args.end());
  return plan;
}

bool SystemdBooted(const std::string& marker) {
  struct stat st {};
  return ::lstat(marker.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string VmScopeUnit(const std::string& vm) {
  std::string unit = "hvtrace-vm-";
  for (char c : vm) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '_' || c == '-' || c == ':' || (c == '.' && !unit.empty())) {
      unit += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      unit += hex;
    }
  }
  return unit + ".scope";
}

std::vector<std::string> SystemdScopeLauncher(const std::string& vm) {
  return {"systemd-run", "--scope", "--unit=" + VmScopeUnit(vm), "--collect", "--quiet", "--"};
}

std::vector<std::string> LaunchArgv(const std::vector<std::string>& launcher,
                                    const std::vector<std::string>& qemu_argv) {
  std::vector<std::string> all = launcher;
  all.insert(all.end(), qemu_argv.begin(), qemu_argv.end());
  return all;
}

}  // namespace hvtrace::hostd
