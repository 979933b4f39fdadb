#include "boot_trace.h"

#include <algorithm>
#include <set>

namespace hvtrace::hostd {

const std::vector<std::string>& BootTraceEvents() {
  static const std::vector<std::string> events = {
      "fw_cfg_select",
      "fw_cfg_read",
      "virtio_set_status",
      "pci_cfg_write",
      "msix_write_config",
      "virtio_serial_handle_control_message",
      "virtio_serial_send_control_event",
      "virtio_console_chr_event",
  };
  return events;
}

Result<std::vector<std::string>> BootTraceArgs(const std::string& log_path,
                                               const std::vector<std::string>& events) {
  // -D takes the rest of the argument as the path: no option syntax to escape,
  // but a path must be absolute so QEMU's working directory does not matter.
  if (log_path.empty() || log_path[0] != '/') {
    return Error{"QEMU trace log path '" + log_path + "' is not absolute"};
  }
  if (events.empty()) return Error{"no QEMU trace events to enable"};
  std::vector<std::string> args = {"-msg", "timestamp=on", "-D", log_path};
  for (const std::string& e : events) {
    const bool plain = !e.empty() && std::all_of(e.begin(), e.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    });
    if (!plain) return Error{"QEMU trace event '" + e + "' is not [a-z0-9_]"};
    args.insert(args.end(), {"-trace", "enable=" + e});
  }
  return args;
}

Status CheckHandshakeDevices(const std::vector<std::string>& devices) {
  std::set<std::string> seen;
  for (const std::string& d : devices) {
    if (std::find(std::begin(kHandshakeDevices), std::end(kHandshakeDevices), d) ==
        std::end(kHandshakeDevices)) {
      return Error{"device '" + d + "' is not one of virtio-blk, virtio-net, virtio-serial"};
    }
    if (!seen.insert(d).second) return Error{"device '" + d + "' is given twice"};
  }
  return {};
}

Result<std::vector<std::string>> HandshakeDeviceArgs(const std::vector<std::string>& devices) {
  if (Status s = CheckHandshakeDevices(devices); !s.ok()) return s.error();
  std::vector<std::string> a;
  for (const std::string& d : devices) {
    if (d == "virtio-blk") {
      a.insert(a.end(), {"-drive", "driver=null-co,id=hvt_blk0,if=none,read-zeroes=on,size=64M",
                         "-device", "virtio-blk-pci,drive=hvt_blk0,id=hvt_dev_blk"});
    } else if (d == "virtio-net") {
      a.insert(a.end(), {"-netdev", "user,id=hvt_net0,restrict=on", "-device",
                         "virtio-net-pci,netdev=hvt_net0,id=hvt_dev_net"});
    } else {
      a.insert(a.end(), {"-device", "virtio-serial-pci,id=hvt_dev_vser"});
    }
  }
  return a;
}

}  // namespace hvtrace::hostd
